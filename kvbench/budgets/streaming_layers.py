"""The streaming layer rule (DuoAttention's, `Policy.layer_budget = "streaming"`): every layer of a sample holds,
per head, what a streaming head keeps: `policy.window` (sink_size + recent_size); under after_prefill min(prompt,
window), so a prompt no longer than the window is not compressed.

The budget is what the schedule evicts on (a prompt longer than the window is compressed once after prefill) and
what the record reports; the pairs each head then keeps are the pattern head rule's (kvbench.budgets.pattern_heads:
a retrieval head keeps them all). The policy's budget knobs play no part (kv_size is inert, compression_ratio is its
head_compression_ratio).
"""

from __future__ import annotations

from typing import ClassVar

import torch

from kvbench.budgets.rule import LayerRule


class StreamingLayers(LayerRule):
    name: ClassVar[str] = "streaming"
    label: ClassVar[str] = "DuoAttention"

    def budgets(self, policy, per_sample: torch.Tensor, layers: int, lengths: list[int]) -> torch.Tensor:
        w = policy.window  # after_prefill: a prompt shorter than it is not compressed; else the window while running
        row = torch.tensor([min(n, w) if policy.once else w for n in lengths], dtype=torch.long, device="cpu")
        return row[None, :].expand(layers, -1).clone()

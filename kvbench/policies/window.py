"""Sliding window: keep the most recent pairs (+ `protect_first` attention sinks, StreamingLLM uses 4).

Under prefill_and_decode this is block-wise sliding-window attention during prefill too.
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from kvbench.policies.policy import Policy, ScoreContext


@dataclass
class Window(Policy):
    kv_size: int | None = 512
    evict_every: int = 64
    name: ClassVar[str] = "window"
    label: ClassVar[str] = "Window"
    summary: ClassVar[str] = "the newest pairs (and `protect_first` sinks)"
    keeps_newest: ClassVar[bool] = True  # the score below, known without computing it

    def score(self, stats: ScoreContext) -> torch.Tensor:
        return stats.pos.float()  # newer = keep

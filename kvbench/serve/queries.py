"""Each request's newest `window` queries, per layer (RoPE applied), for the policies that score with them.

SnapKV and PyramidKV score pairs by the attention of the newest W queries processed (their observation
window), whatever forwards they came from. The static cache keeps them per sample; here each running
request keeps its own (L, H_q, W, D) window and their positions (W,) (-1: empty, fewer processed), updated
by every layer of every forward from the request's packed queries, and dropped when it finishes or is
preempted (a recomputed request fills it again). Not in the pool: W x H_q x D per layer per request.
"""

from __future__ import annotations

import torch


class QueryWindows:
    def __init__(self, window: int, num_layers: int, num_q_heads: int, head_dim: int, dtype, device):
        self.W, self.L, self.Hq, self.D = window, num_layers, num_q_heads, head_dim
        self.dtype, self.device = dtype, device
        self.q: dict[int, torch.Tensor] = {}  # rid -> (L, H_q, W, D)
        self.pos: dict[int, torch.Tensor] = {}  # rid -> (W,) source positions, oldest first
        self.scale: float | None = None  # the attention's softmax scale, seen at the first forward
        self._plan: list[tuple[int, slice, int]] = []

    def prepare(self, rids: list[int], starts: list[int], k: list[int], fresh: list[bool]) -> None:
        """Before a forward: each request's packed slice of its newest min(k, W) tokens."""
        self._plan, off = [], 0
        for rid, a, n, new in zip(rids, starts, k, fresh, strict=True):
            if new or rid not in self.q:
                self.q[rid] = torch.zeros(self.L, self.Hq, self.W, self.D, dtype=self.dtype, device=self.device)
                self.pos[rid] = torch.full((self.W,), -1, dtype=torch.long)
            m = min(n, self.W)
            self.pos[rid] = torch.cat([self.pos[rid][m:], torch.arange(a + n - m, a + n)])
            self._plan.append((rid, slice(off + n - m, off + n), m))
            off += n

    def update(self, layer: int, query: torch.Tensor, scaling: float | None) -> None:
        """query (1, H_q, T, D): this layer's packed queries."""
        self.scale = scaling
        for rid, sl, m in self._plan:
            w = self.q[rid][layer]  # (H_q, W, D)
            w.copy_(torch.cat([w[:, m:], query[0, :, sl].to(w.dtype)], dim=1))

    def get(self, rid: int) -> tuple[torch.Tensor, torch.Tensor]:
        """((L, 1, H_q, W, D) queries, (1, 1, 1, W) positions) of one request, for ScoreContext."""
        return self.q[rid][:, None], self.pos[rid][None, None, None, :].to(self.device)

    def forget(self, rid: int) -> None:
        self.q.pop(rid, None)
        self.pos.pop(rid, None)

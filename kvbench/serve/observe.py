"""Serve mode's observe step: a policy's `observe` (kvbench.policies.needs) over each request of a forward.

Each running request keeps its own row state, {name: (L, *shape)} float32 (the policy's `needs.row_state`),
created at its first chunk and dropped when it finishes or is preempted (a recomputed request observes its
tokens again), like the query windows (kvbench.serve.queries): not in the pool. At every layer of every forward
the packed tokens are cut per request and the policy observes each (B = 1, every column real, positions
num_computed ...); the per-pair statistics it returns go to the pool's `own` slots of the new pairs (they stay in
their page, so an eviction takes them along).
"""

from __future__ import annotations

import torch

from kvbench.policies.needs import Observation


class Observers:
    def __init__(self, policy, shapes: dict[str, tuple[int, ...]], num_layers: int, device, rotary=None, modules=None):
        self.policy, self.shapes, self.L, self.device, self.rotary = policy, shapes, num_layers, device, rotary
        self.modules = modules  # each layer's attention module (ScoreContext.modules)
        self.state: dict[int, dict[str, torch.Tensor]] = {}  # rid -> {name: (L, *shape)}
        self._plan: list[tuple[int, slice, int]] = []

    def prepare(self, rids: list[int], starts: list[int], k: list[int], fresh: list[bool]) -> None:
        """Before a forward: each request's packed slice and its first position."""
        self._plan, off = [], 0
        for rid, a, n, new in zip(rids, starts, k, fresh, strict=True):
            if new or rid not in self.state:
                self.state[rid] = {name: torch.zeros(self.L, *s, dtype=torch.float32, device=self.device)
                                   for name, s in self.shapes.items()}
            self._plan.append((rid, slice(off, off + n), a))
            off += n

    def observe(self, pool, write: torch.Tensor, layer: int, module, query, key, value, scaling,
                hidden: torch.Tensor | None) -> None:
        """query (1, Hq, T, D), key/value (1, H_kv, T, D): the layer's packed new tokens; write (T, H) their slots."""
        for rid, sl, a in self._plan:
            n = sl.stop - sl.start
            pos = torch.arange(a, a + n, device=query.device)[None]  # (1, n)
            obs = Observation(layer=layer, module=module, hidden=None if hidden is None else hidden[:, sl],
                              positions=pos, real=torch.ones_like(pos, dtype=torch.bool), query=query[:, :, sl],
                              key=key[:, :, sl], value=value[:, :, sl], scaling=scaling,
                              state={name: x[layer][None] for name, x in self.state[rid].items()}, rotary=self.rotary)
            for name, x in (self.policy.observe(obs) or {}).items():  # (1, H, n) per new pair
                pool.own[name][write[sl]] = x[0].transpose(0, 1).float()

    def forget(self, rid: int) -> None:
        self.state.pop(rid, None)

"""Serve mode's scoring passes: a policy's extra forwards over one request's context (KVzip's reconstruction),
run when the request reaches its compression point (schedule=after_prefill: its prompt computed, before the one
compression), as the static engine runs them (kvbench.attention.pass_step: the same `scoring_passes` / `pass_scores`,
the same `PassStep`).

One request at a time (a request passes once, at its compression point; a preempted one again after its
recompute). The pass attends to the request's held pairs read from its pages (every (layer, KV head) holds the
whole prompt then, nothing evicted) and to its own keys and values, a transient never written to the pool. The
running max over passes, (L, 1, H_kv, N) in the request's logical slot order, is kept per request until its
compression has used it (`ScoreContext.passed`, kvbench.serve.score_context), then dropped. Its memory (the
pass's activations, its statistic) is outside the pool, like the query windows' and the forward's activations.
Their time (`seconds`, the record's `score_pass_s`) is measured around each request's passes, the device
synchronised once per request (a compression point), never per decode step.
"""

from __future__ import annotations

import time

import torch

from kvbench.attention.pass_step import run_rows


class Passes:
    def __init__(self, model, pool, policy, device):
        self.model, self.pool, self.policy, self.device = model, pool, policy, device
        self.passed: dict[int, torch.Tensor] = {}  # rid -> (L, 1, H, N), until the request's compression
        self.seconds = 0.0  # the passes' time, all requests together

    def get(self, req) -> torch.Tensor:
        """The request's (L, 1, H, N) statistic, its passes run the first time it is asked for."""
        if req.rid not in self.passed:
            t0 = time.perf_counter()
            self.passed[req.rid] = self.run(req)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.seconds += time.perf_counter() - t0
        return self.passed[req.rid]

    def run(self, req) -> torch.Tensor:
        context = req.prompt[: req.num_computed]  # what the pool has seen of its prompt: the prompt
        slots, valid = self.pool.slots(req.pages, req.held)  # (L, H, N)
        if not bool(valid.all()):
            raise RuntimeError("serve: scoring passes run before a request's compression (every head holds its prompt)")
        slots = slots.to(self.device)
        n = torch.full((1,), slots.shape[-1], device=self.device)

        def held(layer: int):  # (1, H, N, D) the layer's pairs, read from the request's pages
            k, v = self.pool.pairs(slots[layer])  # (H, N, D) each, dequantized by a quantized pool
            return k[None], v[None], n

        state: dict = {}  # layer -> (1, H, N) running max
        run_rows(self.model, held, self.policy, state, [self.policy.scoring_passes(list(context))],
                 [len(context)], pad_id=0)  # one row: no pads
        return torch.stack([state[la] for la in range(slots.shape[0])])  # (L, 1, H, N)

    def forget(self, rid: int) -> None:
        self.passed.pop(rid, None)

"""The serving loop: arrivals -> schedule -> run -> sample -> finish, on a measured clock.

The clock advances by each step's measured wall time (CUDA synchronised); when nothing is running
or waiting it jumps to the next arrival instead of sleeping (idle time costs nothing and changes
no measurement). Each step appends one timeline point (clock, pool blocks used, running, waiting), the
first two as they were during the step: taken once the step's blocks are allocated and before the
requests it finished give theirs back, so the peak is the step's own.
A request finishes at `max_new_tokens` or at EOS (unless `ignore_eos`); its output keeps the EOS
like the static engine's, and its blocks go back to the pool at once.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from kvbench.errors import ConfigError
from kvbench.policies.base import Policy
from kvbench.serve.attention import paged
from kvbench.serve.blocks import BlockManager, blocks_for
from kvbench.serve.evict import BlockRule
from kvbench.serve.request import Request
from kvbench.serve.runner import ModelRunner
from kvbench.serve.scheduler import Scheduler


@dataclass
class ServeOutput:
    requests: list[Request]
    wall_s: float = 0.0  # engine clock at the end (busy time + skipped idle gaps)
    busy_s: float = 0.0  # sum of step times
    steps: int = 0
    preemptions: int = 0
    recomputed_tokens: int = 0
    evicted_blocks: int = 0
    timeline: list[tuple[float, int, int, int]] = field(default_factory=list)  # (t, blocks used, running, waiting)
    pool_bytes: int = 0
    attention: str = ""  # what attended (kvbench.serve.attention.backend)
    block_bytes: int = 0  # one block in every layer: K, V, positions, statistics
    kv_block_bytes: int = 0  # one block in every layer: K and V only


def max_blocks(req: Request, rule: BlockRule) -> int:
    """Most blocks the request can ever hold alone (its KV never includes the last output token)."""
    total = len(req.prompt) + req.max_new_tokens - 1
    if rule.kv_size is None:
        return blocks_for(total, rule.block_size)
    if rule.in_prefill:
        return blocks_for(min(total, rule.kv_size), rule.block_size)
    return blocks_for(min(total, max(len(req.prompt), rule.kv_size) + rule.block_size), rule.block_size)


def too_small(req: Request, rule: BlockRule, num_blocks: int) -> str:
    """Why a pool of `num_blocks` can never hold `req` (one line)."""
    return (f"a pool of {num_blocks} blocks of {rule.block_size} tokens can never hold request {req.rid} "
            f"({len(req.prompt)} prompt tokens + {req.max_new_tokens} new): alone it needs {max_blocks(req, rule)} "
            "blocks under this policy and schedule")


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def serve(
    model,
    requests: Sequence[Request],
    policy: Policy,
    *,
    num_blocks: int,
    block_size: int,
    max_tokens_per_step: int,
    max_running: int | None = None,
    block_score: str = "sum",
    eos_token_ids: Sequence[int] = (),
    ignore_eos: bool = False,
    score_chunk: int = 64,
    progress=None,
) -> ServeOutput:
    rule = BlockRule.of(policy, block_size)
    for r in requests:
        if max_blocks(r, rule) > num_blocks:
            raise ConfigError("serve.num_blocks", too_small(r, rule, num_blocks), num_blocks)
    rotate = policy.rerotate and policy.evicts  # cache rotation: kept keys re-rotated to contiguous slots
    runner = ModelRunner(model, num_blocks, block_size, policy, block_score, rotate=rotate)
    bm = BlockManager(num_blocks, block_size)
    evictor = runner.evictor if policy.evicts else None
    sched = Scheduler(bm, rule, max_tokens_per_step, max_running, evictor)
    pending = sorted(requests, key=lambda r: (r.arrival, r.rid))
    eos = set(eos_token_ids)
    out = ServeOutput(requests=list(requests), pool_bytes=runner.pool.nbytes(), attention=runner.attention,
                      block_bytes=runner.pool.nbytes() // num_blocks,
                      kv_block_bytes=2 * runner.pool.k[:, :block_size].numel() * runner.pool.k.element_size())
    clock, left = 0.0, len(pending)
    with paged(model, score_chunk=score_chunk):
        while left:
            while pending and pending[0].arrival <= clock:
                sched.add(pending.pop(0))
            if not sched.running and not sched.waiting:
                clock = pending[0].arrival
                continue
            t0 = time.perf_counter()
            plan = sched.schedule()
            used, running = bm.num_used, len(sched.running)  # during this step, before finished requests leave
            if not plan.scheduled:
                if plan.preempted:
                    continue
                raise RuntimeError("serve: no request could be scheduled (the pool is too small?)")
            if rotate:
                for s in plan.scheduled:
                    if s.evicted:
                        runner.rerotate(s.req)
            nxt = runner.step(plan.scheduled)
            _sync(runner.device)
            dt = time.perf_counter() - t0
            clock += dt
            out.busy_s += dt
            out.steps += 1
            for s in plan.scheduled:
                r = s.req
                r.num_computed += s.num_tokens
                r.n_slots += s.num_tokens
                if r.rid in nxt:
                    tok = nxt[r.rid]
                    r.output.append(tok)
                    if r.first_token_at is None:
                        r.first_token_at = clock
                    if len(r.output) >= r.max_new_tokens or (not ignore_eos and tok in eos):
                        r.finished_at = clock
                        sched.finish(r)
                        left -= 1
                        if progress is not None:
                            progress.update(1)
            out.timeline.append((clock, used, running, len(sched.waiting)))
    out.wall_s = clock
    out.preemptions, out.recomputed_tokens = sched.preemptions, sched.recomputed_tokens
    out.evicted_blocks = sum(r.evicted_blocks for r in requests)
    return out

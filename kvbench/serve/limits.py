"""OpenVINO GenAI's two cache limit checks (`kvbench mode=serve_limits`), on counts alone.

How many pages a request holds depends only on its counts, its budgets per (layer, KV head) and the eviction
rule (`BlockRule`), never on which blocks a score chooses, so both checks replay the real scheduler and
block manager with a runner that only counts (no model is loaded): exact for the pool, the policy (its
budget kind: kv_size, per prompt, per layer) and the schedule of the config. The pool's pages are counted
per (layer, KV head): `Pool.shape` is (1, 1) when every head holds the same count, (layers, 1) under
per-layer budgets (the model's layer count, from its config), or given.

- `longest_generation`: one request (the task's longest prompt) generates until the pool cannot hold
  its next token; eviction makes that unbounded, so it stops at `serve.limit_cap` tokens ("capped").
- `fewest_sequences_to_fill`: the smallest number of requests, all arriving at once, that fills the pool
  (some step uses every block, a request is preempted, or an arrived request waits for blocks), by
  doubling then binary search (assuming more requests never use less of the pool). Request i takes the
  task's prompt i modulo the prompts.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.serve.block_evict import BlockRule
from kvbench.serve.blocks import BlockManager
from kvbench.serve.budgets import RequestBudgets
from kvbench.serve.request import Request
from kvbench.serve.scheduler import Scheduler

MAX_SEQUENCES = 1 << 16  # the fill search gives up beyond this


@dataclass(frozen=True)
class Pool:
    num_blocks: int
    block_size: int
    max_tokens_per_step: int
    max_running: int | None = None
    shape: tuple[int, int] = (1, 1)  # (layers, KV heads) whose pages are counted apart


def limits_shape(policy, layers) -> tuple[int, int]:
    """(1, 1) under one budget per request; (layers, 1) under per-layer budgets (`layers()`: the model's count)."""
    from kvbench.budgets import layer_rule

    return (int(layers()), 1) if policy.evicts and layer_rule(policy).varies else (1, 1)


@dataclass
class Replay:
    filled: bool = False  # some step used every block, a request was preempted, or one waited for blocks
    exhausted: bool = False  # a request could not be scheduled even alone (the pool cannot hold it)
    most_blocks: int = 0
    preemptions: int = 0
    steps: int = 0


def replay(lengths: list[int], max_new_tokens: int, rule: BlockRule, pool: Pool, stop_at_fill: bool = False,
           policy=None, heads=None) -> tuple[Replay, list[Request]]:
    """Serve requests of these prompt lengths (all at time 0) on counts alone; the run's counts and the requests.
    `policy`: the budgets come from it (per prompt, per layer); `heads`: request -> (L, H) budgets given."""
    bm = BlockManager(pool.num_blocks, pool.block_size, pool.shape)
    budgets = RequestBudgets(policy, pool.shape, heads) if policy is not None else None
    sched = Scheduler(bm, rule, pool.max_tokens_per_step, pool.max_running, budgets=budgets)
    reqs = [Request(rid=i, prompt=[0] * n, max_new_tokens=max_new_tokens) for i, n in enumerate(lengths)]
    for r in reqs:
        sched.add(r)
    out, left = Replay(), len(reqs)
    while left:
        plan = sched.schedule()
        out.preemptions = sched.preemptions
        out.most_blocks = max(out.most_blocks, -(-bm.num_used // bm.pages_per_block))
        out.filled |= bm.num_free == 0 or bool(plan.preempted) or sched.waiting_for_memory()
        if (stop_at_fill and out.filled) or (plan.preempted and len(reqs) == 1):
            out.exhausted = bool(plan.preempted)
            break
        if not plan.scheduled:
            out.exhausted = True
            break
        out.steps += 1
        for s in plan.scheduled:
            r = s.req
            r.num_computed += s.num_tokens
            bm.advance(r, s.num_tokens)
            if r.num_computed == r.seq_len:
                r.output.append(0)
                if len(r.output) >= r.max_new_tokens:
                    sched.finish(r)
                    left -= 1
    return out, reqs


def longest_generation(prompt: int, rule: BlockRule, pool: Pool, cap: int, policy=None) -> dict:
    """Tokens one request with a `prompt`-token prompt generates before the pool cannot hold the next one."""
    got, (req,) = replay([prompt], cap, rule, pool, policy=policy)
    return {"prompt_tokens": prompt, "tokens": len(req.output), "capped": not got.exhausted, "cap": cap,
            "most_blocks": got.most_blocks}


def fewest_sequences_to_fill(lengths: list[int], max_new_tokens: int, rule: BlockRule, pool: Pool, policy=None) -> dict:
    """The fewest requests (prompts cycling through `lengths`) that fill the pool; None when none do: when
    doubling the requests no longer raises the most blocks in use, they finish faster than the scheduler
    admits more (its step budget or max_running caps how many run at once) and the pool never fills."""
    tried: dict[int, bool] = {}
    most: dict[int, int] = {}

    def fills(n: int) -> bool:
        if n not in tried:
            got, _ = replay([lengths[i % len(lengths)] for i in range(n)], max_new_tokens, rule, pool, True, policy)
            tried[n], most[n] = got.filled, got.most_blocks
        return tried[n]

    hi = 1
    while not fills(hi):
        if hi >= MAX_SEQUENCES or (hi > 1 and most[hi] <= most[hi // 2]):
            return {"sequences": None, "max_new_tokens": max_new_tokens, "most_blocks": max(most.values()),
                    "tried": sorted(tried.items())}
        hi *= 2
    lo = hi // 2  # fills(lo) is False (or lo == 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fills(mid) else (mid, hi)
    return {"sequences": hi, "max_new_tokens": max_new_tokens, "tried": sorted(tried.items())}

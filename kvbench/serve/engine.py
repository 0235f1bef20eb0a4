"""The serving loop: arrivals -> schedule -> run -> sample -> finish, on a measured clock.

The clock advances by each step's measured wall time (CUDA synchronised); when nothing is running
or waiting it jumps to the next arrival instead of sleeping (idle time costs nothing and changes
no measurement). Each step appends one timeline point (clock, pool blocks used (pages / (layers x KV heads)),
running, waiting), the
first two as they were during the step: taken once the step's blocks are allocated and before the
requests it finished give theirs back, so the peak is the step's own.
A request finishes at `max_new_tokens` or at EOS (unless `ignore_eos`); its output keeps the EOS
like the static engine's, and its pages go back to the pool at once.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from kvbench.attention import kv_attention
from kvbench.budgets import head_rule
from kvbench.errors import ConfigError
from kvbench.models.geometry import model_geometry
from kvbench.policies.policy import Policy
from kvbench.serve.block_evict import BlockRule
from kvbench.serve.blocks import BlockManager
from kvbench.serve.budgets import HeadBudgets, RequestBudgets
from kvbench.serve.fit import max_blocks, max_pages, stuck, stuck_key, too_long, too_small  # noqa: F401  (max_blocks: the preflight's)
from kvbench.serve.model_runner import ModelRunner
from kvbench.serve.request import Request
from kvbench.serve.scheduler import Scheduler


@dataclass
class ServeOutput:
    requests: list[Request]
    wall_s: float = 0.0  # engine clock at the end (busy time + skipped idle gaps)
    score_pass_s: float = 0.0  # a policy's scoring passes (KVzip's reconstruction), inside the steps' time
    busy_s: float = 0.0  # sum of step times
    steps: int = 0
    preemptions: int = 0
    recomputed_tokens: int = 0
    evicted_blocks: int = 0
    timeline: list[tuple[float, int, int, int]] = field(default_factory=list)  # (t, blocks used, running, waiting)
    pool_bytes: int = 0
    attention: str = ""  # what attended (kvbench.serve.paged_attention.backend)
    block_bytes: int = 0  # one block in every layer: K, V, positions, statistics (+ a quantized pool's window, spread)
    kv_block_bytes: int = 0  # one block in every layer: K and V only
    peak_pages: int = 0  # the most pages in use at once (a page: block_size slots of one layer and KV head)
    pages_per_block: int = 1  # layers x KV heads
    per_head: bool = False  # each (layer, KV head) evicts its own blocks (kvbench.serve.block_evict's head scope)
    decode_pages: list[int] = field(default_factory=list)  # pages in use during each step that decodes a token
    window_bytes: int = 0  # a quantized pool's most full-precision window pages in use at once, in bytes

    @property
    def decode_kv_bytes(self) -> tuple[int | None, int | None]:
        """(mean, largest) bytes of the pool's pages in use (K, V, positions, statistics) during decode steps."""
        if not self.decode_pages:
            return None, None
        page = self.block_bytes / self.pages_per_block
        return int(sum(self.decode_pages) * page / len(self.decode_pages)), int(max(self.decode_pages) * page)

    @property
    def peak_kv_bytes(self) -> int:
        """K and V bytes of the most pages in use at once (a quantized pool's: its quantized pages, plus the most
        full-precision window pages it had in use at once)."""
        return self.peak_pages * self.kv_block_bytes // self.pages_per_block + self.window_bytes


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
    head_budgets: HeadBudgets | None = None,
    kinds=None,
    kv_quant=None,
) -> ServeOutput:
    """Serve `requests`; `head_budgets` (request -> (L, H) pairs) gives each (layer, KV head) its own budget;
    `kinds`: the model's attention kinds when the caller has read them (kvbench.models.loaded.LoadedModel.kinds);
    `kv_quant`: K/V stored quantized (kvbench.quant.qconfig.KVQuant; kvbench.serve.qpool: needs `max_running`)."""
    rule = BlockRule.of(policy, block_size)
    geo = model_geometry(model, kinds)
    shape = (len(geo["layer_devices"]), geo["num_kv_heads"])
    if head_budgets is None and policy.evicts:  # a head rule's own fixed budgets (DuoAttention's pattern), if any
        head_budgets = head_rule(policy).head_budgets(policy, model.config)
    budgets = RequestBudgets(policy, shape, head_budgets)
    for r in requests:
        budget, recent = budgets(r)
        if max_pages(r, rule, budget) > num_blocks * (1 if budget is None else budget.numel()):
            raise ConfigError("serve.num_blocks", too_small(r, rule, num_blocks, budget), num_blocks)
        if (why := stuck(r, rule, budget, recent)) is not None:
            key = stuck_key(policy, head_budgets)
            raise ConfigError(key, why, block_size if key == "serve.block_size" else policy.kv_size)
        if (why := too_long(r, rule, max_tokens_per_step)) is not None:
            raise ConfigError("serve.max_tokens_per_step", why, max_tokens_per_step)
    rotate = policy.rerotate and policy.evicts  # cache rotation: kept keys re-rotated to contiguous slots
    runner = ModelRunner(model, num_blocks, block_size, policy, block_score, rotate=rotate, per_head=budgets.per_head,
                         score_chunk=score_chunk, k=kinds, kv_quant=kv_quant,
                         window_pages=_window_pages(kv_quant, shape, block_size, max_running))
    bm = BlockManager(num_blocks, block_size, shape)
    bm.on_give = runner.pool.given_back
    evictor = runner.evictor if policy.evicts else None
    sched = Scheduler(bm, rule, max_tokens_per_step, max_running, evictor, budgets,
                      runner.reallocate if budgets.adaptive else None)
    pending = sorted(requests, key=lambda r: (r.arrival, r.rid))
    eos = set(eos_token_ids)
    out = ServeOutput(requests=list(requests), pool_bytes=runner.pool.nbytes(), attention=runner.attention,
                      block_bytes=runner.pool.nbytes() // num_blocks, kv_block_bytes=runner.pool.kv_block_bytes(),
                      per_head=budgets.per_head, pages_per_block=bm.pages_per_block)
    clock, left = 0.0, len(pending)
    with kv_attention(model, hidden=policy.needs.hidden):
        while left:
            while pending and pending[0].arrival <= clock:
                sched.add(pending.pop(0))
            if not sched.running and not sched.waiting:
                clock = pending[0].arrival
                continue
            t0 = time.perf_counter()
            plan = sched.schedule()
            for r in plan.preempted:
                runner.forget(r)
            used, running = bm.num_used, len(sched.running)  # during this step, before finished requests leave
            decodes = any(not s.req.in_prefill for s in plan.scheduled)  # some request generates past its prompt
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
                bm.advance(r, s.num_tokens)
                if r.rid in nxt:
                    tok = nxt[r.rid]
                    r.output.append(tok)
                    if r.first_token_at is None:
                        r.first_token_at = clock
                    if len(r.output) >= r.max_new_tokens or (not ignore_eos and tok in eos):
                        r.finished_at = clock
                        sched.finish(r)
                        runner.forget(r)
                        left -= 1
                        if progress is not None:
                            progress.update(1)
            out.peak_pages = max(out.peak_pages, used)
            if decodes:
                out.decode_pages.append(used)
            out.timeline.append((clock, _blocks(used, bm.pages_per_block), running, len(sched.waiting)))
    out.wall_s = clock
    out.score_pass_s = runner.passes.seconds if runner.passes is not None else 0.0
    out.preemptions, out.recomputed_tokens = sched.preemptions, sched.recomputed_tokens
    out.window_bytes = runner.pool.window_peak * runner.pool.window_page_bytes
    out.evicted_blocks = sum(r.evicted_blocks for r in requests)
    return out


def _blocks(pages: int, per_block: int) -> int | float:
    """Pages in use as blocks (one page in every layer and KV head): an int when whole."""
    return pages // per_block if pages % per_block == 0 else round(pages / per_block, 3)


def _window_pages(kv_quant, shape: tuple[int, int], block_size: int, max_running: int | None) -> int:
    """Full-precision window pages of a quantized pool (kvbench.serve.qpool), 0 for a pool in the model's dtype."""
    if kv_quant is None:
        return 0
    if max_running is None:
        raise ConfigError("serve.max_running", "a quantized pool holds each running request's full-precision window "
                          "in pages sized by the most requests running at once: set it", None)
    from kvbench.serve.qpool import window_pages_for

    return window_pages_for(num_layers=shape[0], num_kv_heads=shape[1], block_size=block_size,
                            residual=kv_quant.residual, max_running=max_running)

"""One batch, end to end: the prefill chunks (each after the evictions it needs), the question's forward when
query-agnostic, then the decode loop (one token per step, evicting before a step when a sample's cache is
full), timed at each boundary; `generate_batch` is the entry and releases the cache on every path."""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from kvbench.attention import SCORE_CHUNK
from kvbench.cache import KVCache, heads
from kvbench.cache.layout import right_aligned, to_device
from kvbench.engine.batch import Batch
from kvbench.engine.evictions import execute
from kvbench.engine.scoring_passes import run_passes
from kvbench.models.compat import cache_kwarg
from kvbench.models.geometry import model_geometry
from kvbench.policies.policy import Policy

EOS_CHECK_EVERY = 8  # decode steps between two checks that every sample is done (each check syncs the device)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Forward:
    """One model forward over a (B, T) chunk with the cache: true positions, logits of the last position only
    (`logits=True`) or none (an intermediate prefill chunk runs the decoder alone)."""

    def __init__(self, model, cache: KVCache, observer, attention: str, score_chunk: int):
        self.model, self.cache, self.observer = model, cache, observer
        self.step = cache.attention_step(attention, score_chunk)  # what attention reads (kvbench.attention.static_step)
        self.dev = model.get_input_embeddings().weight.device
        self.base = model.get_decoder()
        self.names = cache_kwarg(model), cache_kwarg(self.base)  # `cache` from transformers 5.24 on

    def __call__(self, tokens: torch.Tensor, r: torch.Tensor, logits: bool) -> torch.Tensor | None:
        cache = self.cache
        positions = cache.begin_forward(r, tokens.shape[1])  # (B, T)
        host = to_device({"ids": tokens if tokens.device.type == "cpu" else None, "pos": positions}, self.dev)
        kw = {"input_ids": tokens if host["ids"] is None else host["ids"], "position_ids": host["pos"],
              "use_cache": True, "kvbench_step": self.step, (self.names[0] if logits else self.names[1]): cache}
        if cache.linear and tokens.shape[1] > 1:  # a hybrid's linear layers zero the pads' inputs (kvbench.grid)
            kw["attention_mask"] = to_device({"m": right_aligned(r, tokens.shape[1])[0].long()}, self.dev)["m"]
        out = None
        if logits:
            out = self.model(**kw, logits_to_keep=1).logits[:, -1]  # (B, V)
        else:  # an intermediate prefill chunk only fills the cache: its hidden states are dropped at once
            self.base(**kw)
        if self.observer:
            self.observer("forward", cache)
        return out


def prefill(batch: Batch, plan, policy: Policy, forward: Forward, observer) -> torch.Tensor:
    """The prompt's forwards (and the question's, query-agnostic), each after the actions the plan puts before it;
    returns the first generated token (B,)."""
    out, passes = None, policy.needs.passes and policy.evicts  # the policy's scoring passes: at its compression point
    while out is None:  # the plan's prefill steps: the last one (the prompt's, or the question's) makes logits
        step = next(plan)
        if passes and step.kind == "question":  # query-agnostic: over the context, before it is compressed
            run_passes(batch, policy, forward)
            passes = False
        execute(batch.cache, step, policy, observer)
        out = forward(batch.chunk_ids(step.tokens, step.width), step.tokens, logits=step.logits)
    if passes:  # after the prompt's prefill, before the first decode step's compression
        run_passes(batch, policy, forward)
    return out.argmax(-1).to(forward.dev)  # (B,) the logits are not kept alive through the decode loop


def decode(batch: Batch, plan, policy: Policy, forward: Forward, observer, first: torch.Tensor, n_tokens: int,
           eos: torch.Tensor, pad_token_id: int, ignore_eos: bool,
           held: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Decode up to `n_tokens` tokens from `first` (B,), each step after the actions the plan puts before it;
    returns (tokens (B, steps) on the CPU, alive mask or None). `held`: gets the cache's allocated bytes during
    each decode step (after a resize the plan put before it; tensor sizes, no device sync)."""
    dev, B = forward.dev, len(batch.lengths)
    done = torch.zeros(B, dtype=torch.bool, device=dev)
    next_tok, steps = first, [first]
    alive = [torch.ones(B, dtype=torch.bool, device=dev)]
    for i in range(1, n_tokens):
        if not ignore_eos:
            done = done | torch.isin(next_tok, eos)
            if i % EOS_CHECK_EVERY == 0 and bool(done.all()):  # a device sync: every EOS_CHECK_EVERY steps only
                break
        step = next(plan)
        execute(batch.cache, step, policy, observer)
        if held is not None:
            held.append(batch.cache.allocated_bytes())
        nxt = forward(next_tok[:, None], step.tokens, logits=True).argmax(-1).to(dev)  # the logits die here
        if not ignore_eos:
            nxt = torch.where(done, torch.full_like(nxt, pad_token_id), nxt)
            alive.append(~done)
        next_tok = nxt
        steps.append(next_tok)
    return torch.stack(steps, dim=1), None if ignore_eos else torch.stack(alive, dim=1)


@torch.inference_mode()
def generate_batch(model, ids: list[list[int]], policy: Policy, *, max_new_tokens: int,
                   eos_token_ids: Sequence[int] = (), pad_token_id: int = 0, ignore_eos: bool = False,
                   prefill_chunk: int | None = None, observer=None, geometry: dict | None = None,
                   decode_steps: int | None = None, question_tokens: list[int] | None = None,
                   attention: str = "sdpa", score_chunk: int = SCORE_CHUNK,
                   kv_quant=None) -> tuple[list[list[int]], dict]:
    """Greedy-generate for one batch of token-id prompts (inside `kvbench.attention.kv_attention(model)`).
    Returns (token ids per prompt, stats). `attention`: the backend, already resolved (kvbench.attention.resolve).

    `decode_steps`: stop after this many decode steps (a probe); the cache is sized for max_new_tokens.
    `question_tokens`: per prompt, its last tokens that are the question (query-agnostic, kvbench.engine).
    """
    geometry = {**(geometry or model_geometry(model)), "quant": kv_quant}  # the cache's K/V quantized or not
    if question_tokens is not None and not any(question_tokens):
        question_tokens = None
    batch = Batch(model, ids, policy, max_new_tokens, pad_token_id, geometry, prefill_chunk, question_tokens)
    try:
        forward = Forward(model, batch.cache, observer, attention, score_chunk)
        return run_batch(batch, policy, forward, max_new_tokens, eos_token_ids, pad_token_id, ignore_eos,
                         observer, decode_steps)
    finally:  # on every path (return, EOS, OOM, interrupt): the cache's tensors go now, not at the next gc
        batch.cache.release()


def run_batch(batch: Batch, policy: Policy, forward: Forward, max_new_tokens, eos_token_ids, pad_token_id,
              ignore_eos, observer, decode_steps) -> tuple[list[list[int]], dict]:
    """Prefill then decode one built batch, timed; the stats `GenerationOutput.add` reads."""
    cache = batch.cache
    allocated = cache.allocated_bytes()  # the largest: a cache only shrinks (decode_only resize)
    dev = forward.dev
    eos = torch.tensor(list(eos_token_ids), dtype=torch.long, device=dev)
    sync(dev)
    t0 = time.perf_counter()
    plan = iter(batch.plan)
    first = prefill(batch, plan, policy, forward, observer)
    sync(dev)
    t1 = time.perf_counter()
    n_tokens = max_new_tokens if decode_steps is None else min(max_new_tokens, 1 + decode_steps)
    held: list[int] = []  # the cache's allocated bytes during each decode step
    tokens, alive = decode(batch, plan, policy, forward, observer, first, n_tokens, eos, pad_token_id, ignore_eos,
                           held)
    sync(dev)
    t2 = time.perf_counter()
    tokens = tokens.cpu()  # (B, steps)
    if alive is None:
        result, generated = tokens.tolist(), tokens.numel()
    else:
        keep = alive.cpu()
        result = [tokens[b][keep[b]].tolist() for b in range(len(batch.lengths))]
        generated = int(keep.sum())
    sections = cache.timer.totals()  # after the final sync: CUDA events are read without stalling the loop
    return result, dict(
        prefill_s=t1 - t0, decode_s=t2 - t1, evict_s=sections.get("evict", 0.0),
        attn_stats_s=sections.get("attn_stats", 0.0), score_pass_s=sections.get("score_pass", 0.0),
        generated_tokens=generated,
        peak_kv_bytes=cache.peak_kv_bytes, kv_allocated_bytes=allocated, decode_kv_bytes=held,
        kept_pairs=heads.kept_pairs(cache.groups, cache.seen),  # (held, brought) at the end: the share really kept
        budgets=batch.held_budgets,  # (L_full, B) what the compressed layers' heads held, None for the full cache
    )

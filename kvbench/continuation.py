"""Log-likelihood of a continuation against the compressed cache of its context (lm-eval's `loglikelihood`).

Per request the ids are context + continuation. The context less its last token is prefilled under the
policy's schedule (its budget from the context's length), then compressed as the schedule compresses a
prompt before its next token (`compress_for_reading`: after_prefill down to the budget; the other schedules,
where the cache is full, down to the budget less evict_every), whatever the continuation. Then one chunk
brings the context's last token and the continuation but its last token, and its logits score every
continuation token: the continuation is read in full and never evicted, so the cache grows to hold the
compressed context and the whole continuation (at most budget + continuation pairs), and every choice of a
multiple-choice question is read against the same compressed context. Nothing of the continuation is seen
before the compression. Departures (said by the caller): the context's last token is processed with the
continuation, after the compression, not inside the context; and a continuation longer than the room the
budget leaves is held whole, where a generation would evict while decoding.
Batches are left-padded like generation's; returns (sum of log-probabilities, every token the argmax).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from kvbench.attention import SCORE_CHUNK, kv_attention, resolve_backend
from kvbench.budgets import head_rule, knobs
from kvbench.cache import KVCache
from kvbench.cache.evict import trim_windows
from kvbench.engine import Batch, pad_id
from kvbench.engine.evictions import execute
from kvbench.errors import ConfigError
from kvbench.models.compat import cache_kwarg
from kvbench.models.geometry import model_geometry
from kvbench.policies.policy import Policy
from kvbench.schedule import rows_to_evict


def compress_for_reading(cache: KVCache, q: torch.Tensor, policy: Policy) -> None:
    """Before the q (B,) tokens to read: each group's context compressed as the schedule compresses a prompt
    before its first decode step (kvbench.schedule.rows_to_evict), then grown, where it must be, to hold the q
    tokens on top (windowed groups keep their window: their capacity already holds the widest forward)."""
    trim_windows(cache.groups, q, cache.gather_layers)
    with cache.timer("evict", cache.devices):
        for g in cache.groups:
            if g.sliding is not None:
                continue
            if policy.evicts:
                k = torch.as_tensor(policy.kv_size if g.budget is None else g.budget, device="cpu").expand_as(q)  # (B,)
                rows = rows_to_evict(g.load, torch.ones_like(q), policy, False, k, first_decode=True)
                if rows is not None:
                    cache.evict(rows, knobs.keep(policy, k), policy, group=g)
            need = int(g.n.max()) + int(q.max())  # the continuation is never evicted
            if g.capacity < need:
                cache.resize(need, group=g)


@torch.inference_mode()
def _score_batch(model, ids: list[list[int]], n_cont: list[int], policy: Policy, pad: int, geometry,
                 prefill_chunk: int | None, backend: str, score_chunk: int) -> list[tuple[float, bool]]:
    prompts = [x[:-1] for x in ids]  # the last continuation token is only a target
    batch = Batch(model, prompts, policy, 1, pad, geometry, prefill_chunk, list(n_cont))
    cache = batch.cache
    dev = model.get_input_embeddings().weight.device
    base = model.get_decoder()
    cache_name, base_cache_name = cache_kwarg(model), cache_kwarg(base)
    step = cache.attention_step(backend, score_chunk)  # what attention reads (kvbench.attention.static_step)

    def forward(tokens, r, keep: int):
        positions = cache.begin_forward(r, tokens.shape[1])
        kw = {"input_ids": tokens.to(dev), "position_ids": positions.to(dev), "use_cache": True,
              "kvbench_step": step, (cache_name if keep else base_cache_name): cache}
        return model(**kw, logits_to_keep=keep).logits if keep else base(**kw)

    try:
        for planned in itertools.islice(batch.plan, len(batch.chunks)):  # the context's forwards, each after the
            execute(cache, planned, policy, None)  # actions the plan puts before it
            forward(batch.chunk_ids(planned.tokens, planned.width), planned.tokens, 0)
        q = batch.question
        compress_for_reading(cache, q, policy)
        width = int(q.max())
        logits = forward(batch.chunk_ids(q, width), q, width).double()  # (B, width, V), right-aligned
        out = []
        for b, (x, n) in enumerate(zip(ids, n_cont, strict=True)):
            lp = torch.log_softmax(logits[b, width - n:], dim=-1)  # (n, V)
            target = torch.tensor(x[-n:], device=lp.device)
            out.append((float(lp.gather(1, target[:, None]).sum()), bool((lp.argmax(-1) == target).all())))
        return out
    finally:
        cache.release()


def continuation_logprobs(model, ids: Sequence[Sequence[int]], n_cont: Sequence[int], policy: Policy,
                          batch_size: int = 1, *, prefill_chunk: int | None = None, score_chunk: int = SCORE_CHUNK,
                          attention: str = "auto", tokenizer=None) -> list[tuple[float, bool]]:
    """(log P(continuation | compressed context), greedy) per request; `ids` = context + continuation ids,
    `n_cont` the continuation's length (>= 1, and the context >= 1 token)."""
    if any(n < 1 or len(x) - n < 1 for x, n in zip(ids, n_cont, strict=True)):
        raise ValueError("a request needs at least one context and one continuation token")
    if policy.no_loglikelihood:
        raise ConfigError("policy", f"{policy.name} does not run on log-likelihood requests: {policy.no_loglikelihood}")
    geometry = model_geometry(model)
    pad = pad_id(model, tokenizer) if tokenizer is not None else 0
    backend = resolve_backend(attention, model, policy.needs.attention, head_rule(policy).uneven)
    out: list[tuple[float, bool]] = []
    with kv_attention(model, hidden=policy.needs.hidden):
        for s in range(0, len(ids), batch_size):
            out += _score_batch(model, [list(x) for x in ids[s:s + batch_size]], list(n_cont[s:s + batch_size]),
                                policy, pad, geometry, prefill_chunk, backend, score_chunk)
    return out

"""Serving over a quantized paged pool (gen.kv_cache_dtype=int8|int4, kvbench.serve.qpool) on the tiny model.

- the full cache: serve gives the static engine's tokens under the same quantization (pages of G tokens are the
  static cache's key blocks), when both feed the prompts in the same chunks: whole (batched, continuous), and in
  chunks of 7 that start and end inside pages (each forward's attention reads the pairs as the cache holds them
  after its write, so the chunking is part of the result in both engines);
- Batch-Max (evicting whole pages) and policies that score the cached keys serve to the end over an int4 pool,
  the tokens moved by the quantization, the pool's bytes those counted from its dimensions;
- every registered evicting policy serves to the end over an int4 pool, its window pages all back at the end;
- a preempted request's recompute over a quantized pool is not exact (documented), unlike the plain pool's;
- a quantized pool needs `max_running` (its window pages are sized by it).
"""

from __future__ import annotations

import pytest
import torch

from kvbench import engine
from kvbench.errors import ConfigError
from kvbench.policies import BatchMax, Full, registry
from kvbench.quant.qconfig import KVQuant
from kvbench.serve import qpool
from kvbench.serve.engine import serve
from kvbench.serve.request import Request
from tests.conftest import random_prompts
from tests.serve.test_engine import EVICTING, NOT_AFTER_PREFILL, _after_prefill

LENGTHS, NEW, BS = (37, 12, 25, 40), 12, 16


def _requests(prompts):
    return [Request(rid=i, prompt=list(p), max_new_tokens=NEW) for i, p in enumerate(prompts)]


def _static(lm, prompts, q, chunk=None):
    return engine.generate(lm.model, lm.tokenizer, prompts, Full(), batch_size=1, max_new_tokens=NEW,
                           eos_token_ids=[], kv_quant=q, prefill_chunk=chunk).token_ids


@pytest.mark.parametrize(("bits", "residual"), [(8, 0), (4, 5)])
@pytest.mark.parametrize(("step", "running", "chunk"), [(256, 4, None), (7, 1, 7)], ids=["whole", "chunks_of_7"])
def test_full_cache_matches_the_static_engine_quantized_alike(tiny_llama, bits, residual, step, running, chunk):
    prompts = random_prompts(LENGTHS, seed=3)
    q = KVQuant(bits, BS, residual)
    want = _static(tiny_llama, prompts, q, chunk)
    reqs = _requests(prompts)
    out = serve(tiny_llama.model, reqs, Full(), num_blocks=32, block_size=BS, max_tokens_per_step=step,
                max_running=running, kv_quant=q)
    assert out.preemptions == 0
    assert [r.output for r in reqs] == want
    if bits == 4:  # the quantization moved tokens (int8 in float64 moves none of these)
        assert want != _static(tiny_llama, prompts, None, chunk)


def _plain_and_int4(lm, policy, prompts):
    got = {}
    for name, q in (("auto", None), ("int4", KVQuant(4, BS, 0))):  # the window: each head's partial page
        reqs = _requests(prompts)
        out = serve(lm.model, reqs, policy, num_blocks=40, block_size=BS, max_tokens_per_step=64, max_running=3,
                    kv_quant=q)
        assert all(len(r.output) == NEW for r in reqs)
        got[name] = (out, [r.output for r in reqs])
    return got


@pytest.mark.parametrize("policy", [BatchMax(kv_size=48, evict_every=16), registry()["knorm"](kv_size=48, evict_every=16)], ids=lambda p: p.name)
def test_an_evicting_policy_serves_over_an_int4_pool(tiny_llama, policy):
    prompts = random_prompts((70, 41, 90), seed=8)
    got = _plain_and_int4(tiny_llama, policy, prompts)
    (plain, plain_tokens), (int4, int4_tokens) = got["auto"], got["int4"]
    assert int4.evicted_blocks > 0 and int4.evicted_blocks == plain.evicted_blocks  # the same counts, page by page
    assert int4_tokens != plain_tokens
    cfg = tiny_llama.model.config
    L, H, D = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
    window = qpool.window_pages_for(num_layers=L, num_kv_heads=H, block_size=BS, residual=0, max_running=3)
    assert int4.pool_bytes == qpool.nbytes_for(num_layers=L, num_blocks=40, block_size=BS, num_kv_heads=H, head_dim=D,
                                               dtype=tiny_llama.model.dtype, track_attention=policy.needs.attention,
                                               bits=4, window_pages=window)
    # float64: 768 bytes a quantized page against 4,096, but each (request, layer, KV head)'s newest page also in a
    # full-precision window page: 0.52 measured at these 48-pair budgets (3 pages a head)
    assert int4.peak_kv_bytes < 0.6 * plain.peak_kv_bytes


def test_a_quantized_pool_needs_max_running(tiny_llama):
    with pytest.raises(ConfigError, match="serve.max_running"):
        serve(tiny_llama.model, _requests(random_prompts((9,))), Full(), num_blocks=8, block_size=BS,
              max_tokens_per_step=64, kv_quant=KVQuant(4, BS, 0))


def test_the_pool_reads_what_attention_read(tiny_llama):
    """After its prompt's forward the pool reads a request's full pages dequantized and its window (residual 0: the
    partial page) as computed."""
    prompts = random_prompts((40,), seed=2)
    pools = {}
    for name, q in (("auto", None), ("int4", KVQuant(4, BS, 0))):
        from kvbench.serve import model_runner

        seen = {}
        step = model_runner.ModelRunner.step

        def spy(self, scheduled, seen=seen, step=step):
            out = step(self, scheduled)
            r = scheduled[0].req
            if "kv" not in seen:  # the prompt's forward (one chunk)
                seen["kv"] = self.pool.pairs(self.pool.slots(r.pages, r.held + scheduled[0].num_tokens)[0])
            return out

        model_runner.ModelRunner.step = spy
        try:
            serve(tiny_llama.model, _requests(prompts)[:1], Full(), num_blocks=8, block_size=BS, max_tokens_per_step=64,
                  max_running=1, kv_quant=q)
        finally:
            model_runner.ModelRunner.step = step
        pools[name] = seen["kv"][0]  # keys (L, H, 40, D) after the prompt's forward
    a, b = pools["auto"][0], pools["int4"][0]  # layer 0: its keys come from the embeddings alone, in both runs
    same = (a == b).all(-1)  # (H, N)
    N = a.shape[-2]
    assert not same[:, : N // BS * BS].any() and same[:, N // BS * BS:].all()  # quantized pages, then the window
    assert torch.allclose(a, b, atol=0.5)


@pytest.mark.parametrize("name", sorted(set(EVICTING) - NOT_AFTER_PREFILL))
def test_every_registered_policy_serves_over_an_int4_pool(tiny_llama, name):
    """Each policy (after_prefill, as tests/serve/test_engine.py runs them all) to the end over an int4 pool: its
    scores, observe step and scoring passes read the pairs dequantized; every window page goes back at the end."""
    from kvbench.serve import engine as serve_engine

    policy = _after_prefill(registry()[name])  # kv 8: pages of 4, so whole pages reach it (the preflight refuses less)
    policy.prepare(tiny_llama.tokenizer, tiny_llama.model)
    pools = []
    runner = serve_engine.ModelRunner

    class Spy(runner):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            pools.append(self.pool)

    reqs = [Request(rid=i, prompt=list(p), max_new_tokens=6) for i, p in enumerate(random_prompts((40, 28, 35), 5))]
    serve_engine.ModelRunner = Spy
    try:
        serve(tiny_llama.model, reqs, policy, num_blocks=160, block_size=4, max_tokens_per_step=64, max_running=2,
              kv_quant=KVQuant(4, 4, 0))
    finally:
        serve_engine.ModelRunner = runner
    assert all(len(r.output) == 6 for r in reqs)
    (pool,) = pools
    assert pool.window_peak > 0 and len(pool.free_window) == pool.fk.shape[0]


def test_a_preempted_request_is_recomputed_as_documented(tiny_llama):
    """Over a quantized pool a preemption's recompute is not exact (docs/serving.md): a pool of 8 blocks preempts,
    and some request's tokens part from those of a pool that holds every request."""
    prompts = random_prompts((37, 12, 25, 40, 9, 30), seed=4)
    got = []
    for blocks in (64, 8):
        reqs = [Request(rid=i, prompt=list(p), max_new_tokens=16) for i, p in enumerate(prompts)]
        out = serve(tiny_llama.model, reqs, Full(), num_blocks=blocks, block_size=BS, max_tokens_per_step=256,
                    max_running=6, kv_quant=KVQuant(4, BS, 0))
        got.append(([r.output for r in reqs], out.preemptions))
    (free, none), (tight, some) = got
    assert none == 0 < some
    assert free != tight and free[0] == tight[0]  # the first request, never preempted, keeps its tokens

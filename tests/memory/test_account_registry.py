"""The account of every registered policy (today's and any added later) against the cache it really allocates.

Static mode: at every forward of a left-padded batch (prefill chunks included), the bytes of the cache's tensors
(K, V, positions, the statistics, query windows, re-rotation copies: every per-slot tensor the groups hold, read
from their storages, not from the cache's own byte count) are the account's KV cache at that forward (`kv_steps`,
folded from the batch's plan: a decode_only resize shows where it happens); the peak of every tensor
storage the batch creates stays within the account (cache + transient, -1% / +15%, as in test_account.py).
Serve mode: at every forward the paged pool's tensors are the account's blocks and the query windows held are
the policy's declared W per running request.
"""

from __future__ import annotations

import pytest
import torch

from kvbench import memory
from kvbench.attention import kv_attention
from kvbench.cache import KVCache
from kvbench.engine import generate_batch
from kvbench.engine import loop as engine_loop
from kvbench.policies import registry
from tests.conftest import random_prompts
from tests.memory.test_account import AllocatedBytes
from tests.policies.test_scored import _at_test_size

LENGTHS = (90, 70, 40)


def tensor_bytes(cache: KVCache) -> int:
    """Bytes of the per-slot tensors (4 or 5 dimensions) every group of `cache` holds, from their storages, and of a
    policy's own state (`needs.pair_state`, `needs.row_state`: the groups' `own` and `rows`)."""
    return sum(x.untyped_storage().nbytes() for g in cache.groups for x in vars(g).values()
               if isinstance(x, torch.Tensor) and x.dim() >= 4 and x.device.type == "cpu") + sum(
        x.untyped_storage().nbytes() for g in cache.groups for x in [*g.own.values(), *g.rows.values()])


@pytest.mark.parametrize("name", sorted(registry()))
def test_account_charges_the_cache_measured_at_every_forward(name, tiny_llama, monkeypatch):
    policy = _at_test_size(name)
    policy.prepare(tiny_llama.tokenizer)  # as kvbench.engine.generate does
    model = tiny_llama.model
    acc = memory.account(model, list(LENGTHS), policy, max_new_tokens=6).devices["cpu"]
    before = {id(c) for c in KVCache.live()}
    seen, in_pass, during_passes = [], [False], []

    def measure(module, args, kwargs):
        held = sum(tensor_bytes(c) for c in KVCache.live() if id(c) not in before)
        (during_passes if in_pass[0] else seen).append(held)  # a scoring pass writes nothing to the cache

    real_passes = engine_loop.run_passes

    def run_passes(*a, **k):
        in_pass[0] = True
        try:
            return real_passes(*a, **k)
        finally:
            in_pass[0] = False

    monkeypatch.setattr(engine_loop, "run_passes", run_passes)

    hook = model.get_decoder().register_forward_pre_hook(measure, with_kwargs=True)  # every forward, chunks too
    try:
        with kv_attention(model, hidden=policy.needs.hidden), AllocatedBytes() as measured:
            generate_batch(model, random_prompts(LENGTHS, seed=3), policy, max_new_tokens=6)
    finally:
        hook.remove()
    assert len(seen) >= 6 and seen == list(acc.kv_steps), (seen, acc.kv_steps)  # forward by forward
    assert max(seen) == acc.kv_cache, (seen, acc.kv_cache)
    assert (len(during_passes) > 0) == policy.needs.passes and all(b == max(seen) for b in during_passes)
    accounted = acc.kv_cache + acc.transient
    assert 0.99 * measured.peak <= accounted <= 1.15 * measured.peak, (accounted, measured.peak)


@pytest.mark.parametrize("name", sorted(registry()))
def test_serve_pool_and_query_windows_are_what_the_declaration_charges(name, tiny_llama, monkeypatch):
    """Serve mode: at every forward, the paged pool's tensors (from their storages) are the account's blocks
    (`PagedPool.block_bytes` x blocks: K, V, positions, and the statistics only when `needs.attention`), and the
    query windows held are W = `needs.queries` queries per layer and query head of each running request."""
    from kvbench.serve import model_runner
    from kvbench.serve.engine import serve
    from kvbench.serve.pool import PagedPool
    from kvbench.serve.queries import QueryWindows
    from tests.serve.test_engine import requests

    policy = _at_test_size(name)
    if policy.needs.passes and policy.evicts:
        pytest.skip("scoring passes: refused in serve mode by the preflight (tests/matrix.py's oracle checks it)")
    made = []
    monkeypatch.setattr(model_runner, "PagedPool", lambda **kw: made.append(PagedPool(**kw)) or made[-1])
    wins = []
    monkeypatch.setattr(model_runner, "QueryWindows", lambda *a: wins.append(QueryWindows(*a)) or wins[-1])
    model, cfg = tiny_llama.model, tiny_llama.model.config
    D = cfg.hidden_size // cfg.num_attention_heads
    blocks = PagedPool.block_bytes(num_layers=cfg.num_hidden_layers, block_size=2, num_kv_heads=cfg.num_key_value_heads,
                                   head_dim=D, dtype=model.dtype, track_attention=policy.needs.attention,
                                   rerotate=policy.rerotate and policy.evicts,
                                   own=len(policy.needs.pair_state) if policy.needs.observes else 0)
    window = cfg.num_hidden_layers * cfg.num_attention_heads * policy.needs.queries * D * model.dtype.itemsize
    seen = []

    def measure(module, args, kwargs):
        (pool,) = made
        pool_bytes = sum(x.untyped_storage().nbytes() for x in [*vars(pool).values(), *pool.own.values()]
                         if isinstance(x, torch.Tensor))
        held = sum(q.untyped_storage().nbytes() for w in wins for q in w.q.values())
        seen.append((pool_bytes, held, sum(len(w.q) for w in wins)))

    hook = model.register_forward_pre_hook(measure, with_kwargs=True)
    try:
        serve(model, requests(random_prompts(LENGTHS, seed=3), 6), policy, num_blocks=96, block_size=2,
              max_tokens_per_step=128 if policy.whole_prompt else 64)  # (Compactor: each prompt in one step)
    finally:
        hook.remove()
    assert len(seen) >= 6 and all(p == 96 * blocks for p, _, _ in seen), (seen[:3], 96 * blocks)
    assert all(h == n * window for _, h, n in seen), seen[:3]
    assert (max(n for _, _, n in seen) > 0) == (policy.needs.queries > 0 and policy.evicts)

"""The account of a quantized cache (gen.kv_cache_dtype=int8 / int4) against what the cache really allocates, for
every registered policy, as tests/memory/test_account_registry.py checks the cache in the model's dtype.

At every forward the bytes of the groups' tensors (positions, statistics, query windows, and the quantized store's
codes, scales, zero points and full-precision window: read from their storages) never exceed the account's KV
cache and reach it (the store allocates by kvbench.quant.qsplit's arithmetic, the account builds the same group on
the meta device); the peak of every tensor storage the batch creates stays within the account (cache +
transient, -1% / +15%): the transient charges the dequantized pairs a quantized cache reads.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kvbench import memory
from kvbench.attention import kv_attention
from kvbench.cache import KVCache
from kvbench.engine import generate_batch
from kvbench.engine import loop as engine_loop
from kvbench.policies import registry
from kvbench.quant.qconfig import KVQuant
from kvbench.quant.qsplit import nbytes_for
from tests.conftest import random_prompts
from tests.memory.test_account import AllocatedBytes
from tests.memory.test_account_registry import LENGTHS, tensor_bytes
from tests.policies.test_scored import _at_test_size


def quant_bytes(cache: KVCache) -> int:
    """`tensor_bytes` and every quantized store's tensors, from their storages."""
    return tensor_bytes(cache) + sum(x.untyped_storage().nbytes() for g in cache.groups if g.store is not None
                                     for x in g.store.tensors().values())


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("name", sorted(registry()))
def test_account_charges_the_quantized_cache_measured_at_every_forward(name, bits, tiny_llama, monkeypatch):
    policy, model = _at_test_size(name), tiny_llama.model
    policy.prepare(tiny_llama.tokenizer)  # as kvbench.engine.generate does
    quant = KVQuant(bits, 8, 8)
    shape = dataclasses.replace(memory.ModelShape.of(model), kv_quant=quant)
    acc = memory.account(shape, list(LENGTHS), policy, max_new_tokens=6).devices["cpu"]
    before = {id(c) for c in KVCache.live()}
    seen, stores, in_pass, during_passes = [], [], [False], []

    def measure(module, args, kwargs):
        new = [c for c in KVCache.live() if id(c) not in before]
        stores.extend(g.store for c in new for g in c.groups if g.store not in stores)
        (during_passes if in_pass[0] else seen).append(sum(quant_bytes(c) for c in new))

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
            generate_batch(model, random_prompts(LENGTHS, seed=3), policy, max_new_tokens=6, kv_quant=quant)
    finally:
        hook.remove()
    assert stores and all(s is not None and s.key_rule.bits == bits for s in stores)  # the cache really is quantized
    s = stores[0]
    L, B, H, _, D = s.rk.shape
    assert s.nbytes() == nbytes_for(batch_size=B, num_kv_heads=H, head_dim=D, capacity=s.capacity, dtype=s.dtype,
                                    bits=bits, group=8, residual=8, num_layers=L)
    assert len(seen) >= 6 and seen == list(acc.kv_steps), (seen, acc.kv_steps)  # forward by forward
    assert max(seen) == acc.kv_cache, (seen, acc.kv_cache)
    assert (len(during_passes) > 0) == policy.needs.passes and all(b == max(seen) for b in during_passes)
    accounted = acc.kv_cache + acc.transient
    assert 0.99 * measured.peak <= accounted <= 1.15 * measured.peak, (accounted, measured.peak, accounted / measured.peak)


def test_the_quantized_cache_is_charged_less_than_the_models_dtype(tiny_llama):
    """The same batch of the full cache, int4 / int8 / the model's dtype: the account's KV cache shrinks with the bits
    (float64 numbers, D = G = R = 16: a pair per head is 256 bytes, 64 at 8 bits, 48 at 4, + its position's 4)."""
    policy, model = _at_test_size("full"), tiny_llama.model
    shape = memory.ModelShape.of(model)
    kv = {b: memory.account(dataclasses.replace(shape, kv_quant=KVQuant(b, 16, 16) if b else None), [900] * 2, policy,
                            max_new_tokens=6).devices["cpu"].kv_cache for b in (None, 8, 4)}
    assert model.dtype == torch.float64
    assert kv[4] < kv[8] < 0.3 * kv[None], kv

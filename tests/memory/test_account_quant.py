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

from kvbench import memory
from kvbench.attention import kv_attention
from kvbench.cache import KVCache
from kvbench.engine import generate_batch
from kvbench.policies import registry
from kvbench.quant.qconfig import KVQuant
from kvbench.quant.qsplit import nbytes_for
from tests.conftest import random_prompts
from tests.memory.test_account_registry import LENGTHS, Forwards, tensor_bytes
from tests.policies.test_scored import _at_test_size


def quant_bytes(cache: KVCache) -> int:
    """`tensor_bytes` and every quantized store's tensors, from their storages."""
    return tensor_bytes(cache) + sum(x.untyped_storage().nbytes() for g in cache.groups if g.store is not None
                                     for x in g.store.tensors().values())


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("name", sorted(registry()))
def test_account_charges_the_quantized_cache_measured_at_every_forward(name, bits, tiny_llama, monkeypatch):
    policy, model = _at_test_size(name), tiny_llama.model
    policy.prepare(tiny_llama.tokenizer, tiny_llama.model)  # as kvbench.engine.generate does
    quant = KVQuant(bits, 8, 8)
    shape = dataclasses.replace(memory.ModelShape.of(model), kv_quant=quant)
    acc = memory.account(shape, list(LENGTHS), policy, max_new_tokens=6).devices["cpu"]
    stores = []

    def cache_bytes(caches):
        stores.extend(g.store for c in caches for g in c.groups if g.store not in stores)
        return sum(quant_bytes(c) for c in caches)

    forwards = Forwards(model, cache_bytes, monkeypatch)
    with kv_attention(model, hidden=policy.needs.hidden), forwards:
        generate_batch(model, random_prompts(LENGTHS, seed=3), policy, max_new_tokens=6, kv_quant=quant)
    assert stores and all(s is not None and s.key_rule.bits == bits for s in stores)  # the cache really is quantized
    s = stores[0]
    L, B, H, _, D = s.rk.shape
    assert s.nbytes() == nbytes_for(batch_size=B, num_kv_heads=H, head_dim=D, capacity=s.capacity, dtype=s.dtype,
                                    bits=bits, group=8, residual=8, num_layers=L)
    forwards.check(acc, policy)

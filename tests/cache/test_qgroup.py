"""The quantized cache inside the engine (kvbench.cache.qgroup): every policy and schedule runs on it.

- wiring: a store whose window holds every pair (R above any count: nothing is ever quantized) must run every
  registered policy, under every schedule it accepts, token for token as the cache in the model's dtype, with
  the same peak of pairs held: the store's appends, reads, evictions (scored or by slicing) and resizes keep
  exactly the slots the plain cache keeps;
- memory: int4 Batch-Max on a prompt long enough for the budget to fill, its K/V as allocated (measured from
  the tensors' storages) and its peak of held pairs below 0.35 of the same run in the model's dtype (float32).
"""

from __future__ import annotations

import dataclasses

import pytest

from kvbench.attention import kv_attention
from kvbench.engine import generate_batch
from kvbench.policies import registry
from kvbench.quant.qconfig import KVQuant
from tests.conftest import random_prompts
from tests.policies.test_scored import _at_test_size

LENGTHS = (90, 70, 40)
SCHEDULES = ("prefill_and_decode", "decode_only", "after_prefill")


def _variants():
    for name in sorted(registry()):
        for schedule in SCHEDULES:
            try:
                yield pytest.param(dataclasses.replace(_at_test_size(name), schedule=schedule), id=f"{name}-{schedule}")
            except Exception:  # a schedule the policy refuses (e.g. extreme_decode: decode_only only)
                continue


@pytest.mark.parametrize("policy", list(_variants()))
def test_a_store_that_quantizes_nothing_runs_as_the_plain_cache(policy, tiny_llama):
    model, prompts = tiny_llama.model, random_prompts(LENGTHS, seed=3)
    policy.prepare(tiny_llama.tokenizer, tiny_llama.model)  # as kvbench.engine.generate does (KVzip's template, DuoAttention's pattern)
    with kv_attention(model, hidden=policy.needs.hidden):
        want, plain = generate_batch(model, prompts, policy, max_new_tokens=6, prefill_chunk=16)
        got, quant = generate_batch(model, prompts, policy, max_new_tokens=6, prefill_chunk=16,
                                    kv_quant=KVQuant(4, 8, 10**6))
    assert got == want
    assert quant["peak_kv_bytes"] == plain["peak_kv_bytes"] > 0


def kv_tensor_bytes(model, run) -> int:
    """The most bytes of K/V storage (a group's k and v, or a quantized store's tensors) any cache held during
    `run()`, read from the tensors' storages at every forward."""
    from kvbench.cache import KVCache

    before, most = {id(c) for c in KVCache.live()}, [0]

    def measure(module, args, kwargs):
        groups = [g for c in KVCache.live() if id(c) not in before for g in c.groups]
        held = [x for g in groups for x in ((g.k, g.v) if g.store is None else g.store.tensors().values())]
        most[0] = max(most[0], sum(x.untyped_storage().nbytes() for x in held))

    hook = model.register_forward_pre_hook(measure, with_kwargs=True)
    try:
        run()
    finally:
        hook.remove()
    return most[0]


def test_int4_batch_max_holds_under_035_of_the_models_dtype():
    """K/V allocated (codes, scales, zero points, the full-precision window) and the peak held: < 0.35 of float32.
    The whole allocation also holds each slot's position (int32, not quantized): below 0.45."""
    from kvbench.models import build_tiny

    model = build_tiny("tiny-llama", arch="llama", dtype="float32", device="cpu").model
    policy = dataclasses.replace(_at_test_size("batch_max"), kv_size=512, evict_every=32)  # R + G - 1 = 31 slots
    prompts, out = random_prompts((1100, 1000), seed=5), {}  # of the window in float32: 6% of the budget

    def run(quant):
        return lambda: out.setdefault(quant, generate_batch(model, prompts, policy, max_new_tokens=8, kv_quant=quant)[1])

    with kv_attention(model):
        plain_kv = kv_tensor_bytes(model, run(None))
        int4_kv = kv_tensor_bytes(model, run(KVQuant(4, 16, 16)))
    int4, plain = out[KVQuant(4, 16, 16)], out[None]
    assert int4_kv < 0.35 * plain_kv, (int4_kv, plain_kv)
    assert int4["peak_kv_bytes"] < 0.35 * plain["peak_kv_bytes"], (int4["peak_kv_bytes"], plain["peak_kv_bytes"])
    assert int4["kv_allocated_bytes"] < 0.45 * plain["kv_allocated_bytes"]

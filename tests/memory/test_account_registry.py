"""The account of every registered policy (today's and any added later) against the cache it really allocates.

Static mode: at every forward of a left-padded batch (prefill chunks included), the bytes of the cache's tensors
(K, V, positions, the statistics, query windows, re-rotation copies: every per-slot tensor the groups hold, read
from their storages, not from the cache's own byte count) are the account's KV cache at that forward (`kv_steps`,
folded from the batch's plan: a decode_only resize shows where it happens); the peak of every tensor
storage the batch creates stays within the account (cache + transient, -1% / +15%, as in test_account.py).
Under a head rule whose counts depend on the scores' values (`data_dependent`: DMS's threshold) the account charges
its bound (nothing evicted): the cache measured stays at or under it at every forward, and reaches it when nothing is
evicted (threshold -inf); the peak stays within the account.
Serve mode: at every forward the paged pool's tensors are the account's blocks and the query windows held are
the policy's declared W per running request.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from kvbench import memory
from kvbench.attention import kv_attention
from kvbench.budgets import head_rule
from kvbench.cache import KVCache
from kvbench.engine import generate_batch
from kvbench.engine import loop as engine_loop
from kvbench.policies import registry
from tests.conftest import random_prompts
from tests.memory.test_account import AllocatedBytes
from tests.policies.test_scored import _at_test_size

LENGTHS = (94, 434, 230)  # left-padded: every prefill needs a mask, (B, T, N) large enough to see what it costs
SERVED = (90, 70, 40)  # serve mode's requests (its pool is counted in pages, its masks are not charged)
# every registered policy at its config's values, then a head rule whose counts depend on the data: (name, knobs,
# what the cache measured is against the account: "equal", "below" it at some forward, or the bound "reached")
CASES = [(name, {}, "equal") for name in sorted(registry())] + [
    ("kvzap", dict(head_budget="threshold", threshold=0.0, sliding_window=8), "below"),
    ("kvzap", dict(head_budget="threshold", threshold=1.0, sliding_window=8, schedule="prefill_and_decode"), "below"),
    ("kvzap", dict(head_budget="threshold", threshold=-math.inf, sliding_window=8), "reached")]


def tensor_bytes(cache: KVCache) -> int:
    """Bytes of the per-slot tensors (4 or 5 dimensions) every group of `cache` holds, from their storages, and of a
    policy's own state (`needs.pair_state`, `needs.row_state`: the groups' `own` and `rows`)."""
    return sum(x.untyped_storage().nbytes() for g in cache.groups for x in vars(g).values()
               if isinstance(x, torch.Tensor) and x.dim() >= 4 and x.device.type == "cpu") + sum(
        x.untyped_storage().nbytes() for g in cache.groups for x in [*g.own.values(), *g.rows.values()])


class Forwards:
    """At every forward of `model`'s decoder inside the block (prefill chunks too), `cache_bytes(caches)` of the
    caches made inside it: in `seen`, or in `during_passes` inside the engine's scoring passes (which write nothing
    to the cache); `peak`: the peak of every tensor storage created inside the block (AllocatedBytes)."""

    def __init__(self, model, cache_bytes, monkeypatch):
        self.model, self.cache_bytes = model, cache_bytes
        self.seen, self.during_passes, self.peak, self._in_pass = [], [], 0, False
        real_passes = engine_loop.run_passes

        def run_passes(*a, **k):
            self._in_pass = True
            try:
                return real_passes(*a, **k)
            finally:
                self._in_pass = False

        monkeypatch.setattr(engine_loop, "run_passes", run_passes)

    def _measure(self, module, args, kwargs):
        new = [c for c in KVCache.live() if id(c) not in self._before]
        (self.during_passes if self._in_pass else self.seen).append(self.cache_bytes(new))

    def __enter__(self):
        self._before = {id(c) for c in KVCache.live()}
        self._hook = self.model.get_decoder().register_forward_pre_hook(self._measure, with_kwargs=True)
        self._allocated = AllocatedBytes().__enter__()
        return self

    def __exit__(self, *exc):
        self._allocated.__exit__(*exc)
        self._hook.remove()
        self.peak = self._allocated.peak

    def check(self, acc, policy, against: str = "equal") -> None:
        """The account `acc` (one device's) is what was measured, forward by forward, and bounds the peak;
        `against` "reached" / "below": a data-dependent rule's bound, reached when nothing is evicted."""
        seen = self.seen
        assert len(seen) >= 6 and len(seen) == len(acc.kv_steps), (seen, acc.kv_steps)
        if against == "equal":
            assert seen == list(acc.kv_steps), (seen, acc.kv_steps)  # forward by forward
            assert max(seen) == acc.kv_cache, (seen, acc.kv_cache)
        else:  # the bound: never exceeded, reached when nothing is evicted, left below when something is
            assert all(b <= a for b, a in zip(seen, acc.kv_steps, strict=True)), (seen, acc.kv_steps)
            assert (seen == list(acc.kv_steps)) == (against == "reached"), (seen, acc.kv_steps)
        assert (len(self.during_passes) > 0) == policy.needs.passes
        assert all(b == max(seen) for b in self.during_passes), self.during_passes
        accounted = acc.kv_cache + acc.transient
        assert 0.99 * self.peak <= accounted, (accounted, self.peak)
        assert against != "equal" or accounted <= 1.15 * self.peak, (accounted, self.peak, accounted / self.peak)


@pytest.fixture(scope="module")
def tiny_llama32():
    """The tiny Llama in float32, the default model's dtype on CPU: float64's 8-byte float mask in SDPA would hide
    a mask built through 8-byte integers (the peak of a padded prefill)."""
    from kvbench.models import build_tiny

    return build_tiny("tiny-llama", arch="llama", dtype="float32", device="cpu")


@pytest.mark.parametrize("name,knobs,against", CASES, ids=[f"{n}{''.join(f'-{k}={v}' for k, v in kw.items())}"
                                                            for n, kw, _ in CASES])
def test_account_charges_the_cache_measured_at_every_forward(name, knobs, against, tiny_llama32, monkeypatch):
    check_account(name, tiny_llama32, monkeypatch, knobs, against)


def check_account(name, tiny_llama, monkeypatch, knobs=None, against="equal"):
    """The account of policy `name` (at test size, `knobs` replaced) against the cache measured at every forward."""
    policy = dataclasses.replace(_at_test_size(name), **(knobs or {}))
    assert head_rule(policy).data_dependent == (against != "equal")  # the rule declares what the account can know
    policy.prepare(tiny_llama.tokenizer, tiny_llama.model)  # as kvbench.engine.generate does
    model = tiny_llama.model
    account = memory.account(model, list(LENGTHS), policy, max_new_tokens=6)
    assert account.upper_bound == (against != "equal") and ("upper bound" in account.describe("cpu")) == account.upper_bound
    acc = account.devices["cpu"]
    forwards = Forwards(model, lambda caches: sum(tensor_bytes(c) for c in caches), monkeypatch)
    with kv_attention(model, hidden=policy.needs.hidden), forwards:
        generate_batch(model, random_prompts(LENGTHS, seed=3), policy, max_new_tokens=6)
    forwards.check(acc, policy, against)


@pytest.mark.parametrize("name", sorted(registry()))
def test_serve_pool_and_query_windows_are_what_the_declaration_charges(name, tiny_llama, monkeypatch):
    """Under a head rule whose counts depend on the scores' values (`data_dependent`: DMS's threshold) the account charges
its bound (nothing evicted): the cache measured stays at or under it at every forward, and reaches it when nothing is
evicted (threshold -inf); the peak stays within the account.
Serve mode: at every forward, the paged pool's tensors (from their storages) are the account's blocks
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
        serve(model, requests(random_prompts(SERVED, seed=3), 6), policy, num_blocks=96, block_size=2,
              max_tokens_per_step=128 if policy.whole_prompt else 64)  # (Compactor: each prompt in one step)
    finally:
        hook.remove()
    assert len(seen) >= 6 and all(p == 96 * blocks for p, _, _ in seen), (seen[:3], 96 * blocks)
    assert all(h == n * window for _, h, n in seen), seen[:3]
    assert (max(n for _, _, n in seen) > 0) == (policy.needs.queries > 0 and policy.evicts)

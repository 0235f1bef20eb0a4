"""Scored policies (Batch-Max, H2O, TOVA; both schedules; protections) against the brute-force
reference of tests/reference.py, which shares no code with the engine.

For every sample, at batch size 1 and inside a left-padded batch of 4 (prompts of different lengths,
some shorter than kv_size), the engine must keep exactly the reference's positions per
(layer, KV head) after every eviction (and at the end), and generate the same greedy tokens.
Guards that the comparison can fail: the reference itself equals `model.generate` with no eviction,
and its kept sets differ from a sliding window's, between heads and between policies.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from kvbench import budgets as B
from kvbench.engine import generate
from kvbench.policies import H2O, TOVA, BatchMax, Window, registry
from tests import reference as R
from tests import reference_generate as G
from tests.conftest import _tiny, hf_greedy, random_prompts

PROMPTS = random_prompts((70, 24, 45, 13), seed=7)  # kv_size 32: two longer, two shorter
NEW = 24  # 13 + 24 > 32: even the shortest prompt evicts while decoding


POLICIES = [
    BatchMax(kv_size=32, evict_every=8),
    BatchMax(kv_size=32, evict_every=8, schedule="decode_only"),
    H2O(kv_size=32),  # decode_only, p = 1, protect_recent = 16
    H2O(kv_size=32, evict_every=4, schedule="prefill_and_decode"),
    TOVA(kv_size=32, per_kv_head=True),  # kvbench's earlier per-KV-head variant: heads differ
    TOVA(kv_size=24, evict_every=3, schedule="prefill_and_decode"),
    BatchMax(kv_size=32, evict_every=8, protect_first=3, protect_recent=5),
    H2O(kv_size=28, evict_every=2, protect_first=2, protect_recent=6, schedule="prefill_and_decode"),
    TOVA(kv_size=32, evict_every=5, protect_first=4, schedule="decode_only"),
]


def pid(p) -> str:
    tag = "-per_kv_head" if getattr(p, "per_kv_head", False) else ""
    return f"{p.name}{tag}-{p.schedule}-kv{p.kv_size}-p{p.evict_every}-f{p.protect_first}-r{p.protect_recent}"


def rule_of(policy) -> str:
    if policy.name == "tova" and policy.per_kv_head:  # kvbench's earlier variant (published: the layer's mean)
        return "last"
    assert policy.name in R.POLICY_RULES, f"write {policy.name}'s rule in tests/reference.py (POLICY_RULES)"
    return R.POLICY_RULES[policy.name]


def spec_of(policy) -> R.Spec:
    return R.Spec(
        rule=rule_of(policy),
        kv_size=policy.kv_size,
        evict_every=policy.evict_every,
        schedule=policy.schedule,
        protect_first=policy.protect_first,
        protect_recent=policy.protect_recent,
        seed=getattr(policy, "seed", 0),
        window=getattr(policy, "window", 0),
        kernel=getattr(policy, "kernel", 7),
        pooling=getattr(policy, "pooling", "max"),
        pool_window=getattr(policy, "pool_window", False),
        lag=getattr(policy, "lag_size", 128),
        n_sink=getattr(policy, "n_sink", 4),
        chunk=getattr(policy, "chunk_length", 0),
    )


@functools.cache
def _ref_model(arch: str) -> R.ReferenceModel:
    return R.ReferenceModel(_tiny(arch).model)


@functools.cache
def reference(arch: str, prompt: tuple[int, ...], spec: R.Spec | None, new: int = NEW) -> R.Trace:
    return R.generate(_ref_model(arch), list(prompt), new, spec)



class PerSample:
    """Engine observer: for each sample, its kept positions after each of ITS evictions, and at the end.

    A sample evicted in an "evict" event iff its count dropped (an eviction always removes pairs).
    """

    def __init__(self, batch: int):
        self.evictions = [[] for _ in range(batch)]
        self.final = [None] * batch
        self.peak = 0
        self.prev_n = None

    @staticmethod
    def kept(cache, b: int) -> list[list[list[int]]]:
        return [cache.kept_positions(layer, b).clone().tolist() for layer in range(cache.num_layers)]

    def __call__(self, event, cache):
        n = cache.n.clone()
        self.peak = max(self.peak, int(n.max()))
        if event == "evict":
            for b in torch.nonzero(n < self.prev_n)[:, 0].tolist():
                self.evictions[b].append((int(cache.seen[b]), self.kept(cache, b)))
        else:
            for b in range(len(self.final)):
                self.final[b] = self.kept(cache, b)
        self.prev_n = n


def run_engine(lm, prompts, policy, batch_size, new=NEW, **kw):
    """Run the engine batch by batch; return (tokens, per-sample eviction traces, final kept, peak n)."""
    tokens, evictions, final, peak = [], [], [], 0
    for i in range(0, len(prompts), batch_size):
        chunk = prompts[i : i + batch_size]
        obs = PerSample(len(chunk))
        out = generate(lm.model, lm.tokenizer, chunk, policy, len(chunk), max_new_tokens=new, eos_token_ids=[], observer=obs, **kw)
        tokens += out.token_ids
        evictions += obs.evictions
        final += obs.final
        peak = max(peak, obs.peak)
    return tokens, evictions, final, peak


# ---------------------------------------------------------------------------- the reference itself


@pytest.mark.parametrize("arch", ["llama", "phi3"])
def test_reference_forward_equals_generate(arch, request):
    """With no eviction the reference's own forward reproduces transformers' greedy tokens."""
    lm = request.getfixturevalue(f"tiny_{arch}")
    for p in PROMPTS:
        assert reference(arch, tuple(p), None).tokens == hf_greedy(lm.model, p, NEW)


def test_reference_is_discriminative():
    """The kept sets are not a window's, differ between heads, and differ between the B."""
    traces = {p.name + p.schedule: reference("llama", tuple(PROMPTS[0]), spec_of(p)) for p in POLICIES[:5]}
    for name, tr in traces.items():
        assert tr.evictions, name
        not_window = heads_differ = False
        for seen, kept in tr.evictions:
            for heads in kept:
                n = len(heads[0])
                not_window |= any(h != list(range(seen - n, seen)) for h in heads)
                heads_differ |= any(h != heads[0] for h in heads)
        assert not_window and heads_differ, name
    kept_seqs = [tuple(str(k) for _, k in tr.evictions) for tr in traces.values()]
    assert len(set(kept_seqs)) == len(kept_seqs)  # every policy/schedule keeps something different
    full = reference("llama", tuple(PROMPTS[0]), None).tokens
    assert sum(tr.tokens != full for tr in traces.values()) >= 3  # eviction changes what is generated


def test_reference_average_rule_differs_from_plain_sum():
    """Batch-Max's age normalisation matters: the same schedule with the plain sum keeps other pairs."""
    avg = R.Spec("average", 32, 8, "prefill_and_decode")
    tr_avg = reference("phi3", tuple(PROMPTS[0]), avg)
    tr_sum = reference("phi3", tuple(PROMPTS[0]), R.Spec("sum", 32, 8, "prefill_and_decode"))
    assert [k for _, k in tr_avg.evictions] != [k for _, k in tr_sum.evictions]
    assert [s for s, _ in tr_avg.evictions] == [s for s, _ in tr_sum.evictions]  # same schedule


# ---------------------------------------------------------------------------- engine == reference


def _at_test_size(name: str):
    """The registered policy `name` at its own config's values (conf/policy), the budget cut to the test's."""
    from hydra.utils import instantiate

    from kvbench.conf import load_option

    node = load_option("policy", name)
    if node.kv_size is not None and node.kv_size > 2:
        node.kv_size, node.evict_every = 32, 8 if node.evict_every is not None else None
    if "window" in node:
        node.window = 8  # the published 64 is more than these prompts hold
    if "sink_size_start" in node:  # Compactor's 8 + 4 sinks score the row's best, tied with its best middle pair:
        node.sink_size_start, node.sink_size_end = 2, 1  # half of a 24-token prompt would fall among them
    return instantiate(node, _convert_="all")


@pytest.mark.parametrize("name", sorted(registry()))
def test_every_registered_policy_matches_its_reference_rule(name, tiny_llama):
    """A new policy joins this test by being registered: it needs its rule in tests/reference.py (written from
    its paper) and then keeps, per sample of a left-padded batch, the pairs and tokens the rule gives."""
    assert name in R.POLICY_RULES, f"write {name}'s rule in tests/reference.py (POLICY_RULES)"
    policy = _at_test_size(name)
    if R.POLICY_RULES[name] is None:  # the full cache: the reference's forward with no eviction
        tokens, _, _, _ = run_engine(tiny_llama, PROMPTS, policy, 4)
        assert tokens == [reference("llama", tuple(p), None).tokens for p in PROMPTS]
        return
    if name in R.METHOD_PARAMS:  # a method of tests/reference_generate.py, compressed once after prefill
        assert_method_matches(tiny_llama, policy, R.POLICY_RULES[name])
        return
    if B.layer_rule(policy).varies:
        pytest.skip("budgets that differ by layer and prompt: tests/budgets/test_per_sample_and_layer.py checks them")
    refs = [reference("llama", tuple(p), spec_of(policy)) for p in PROMPTS]
    assert_traces_match(refs, *run_engine(tiny_llama, PROMPTS, policy, 4)[:3])


def assert_method_matches(lm, policy, method: str) -> None:
    """At compression_ratio 0.5 (the methods' budget), in one left-padded batch of PROMPTS: each row keeps, per
    (layer, KV head), the pairs the method's rule keeps, and decodes its tokens (tests/reference_generate.py)."""
    policy = dataclasses.replace(policy, kv_size=None, compression_ratio=0.5)
    kept = []

    def observer(event, cache):
        if event == "evict":
            kept.append([[[[p for p in h if p >= 0] for h in cache.kept_positions(la, b).tolist()]
                          for la in range(cache.num_layers)] for b in range(len(PROMPTS))])

    out = generate(lm.model, lm.tokenizer, PROMPTS, policy, len(PROMPTS), max_new_tokens=NEW, eos_token_ids=[],
                   observer=observer)
    assert len(kept) == 1  # one compression, after prefill
    for b, p in enumerate(PROMPTS):
        tokens, want = G.generate(_ref_model("llama"), p, NEW, method, 0.5, lm.tokenizer,
                                  **R.METHOD_PARAMS[policy.name](policy))
        assert kept[0][b] == want and out.token_ids[b] == tokens, b


@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("policy", POLICIES, ids=pid)
@pytest.mark.parametrize("arch", ["llama", "phi3"])
def test_engine_matches_reference(arch, policy, batch_size, request):
    assert_engine_matches_reference(request.getfixturevalue(f"tiny_{arch}"), arch, policy, batch_size)


def assert_traces_match(refs, tokens, evictions, final) -> None:
    """Per sample: the engine's eviction times, kept positions after each eviction, final kept positions and
    tokens equal the reference traces."""
    for b, ref in enumerate(refs):
        assert [s for s, _ in evictions[b]] == [s for s, _ in ref.evictions], f"sample {b}: eviction times"
        for j, ((_, got), (seen, want)) in enumerate(zip(evictions[b], ref.evictions, strict=True)):
            assert got == want, f"sample {b}, eviction {j} (after {seen} positions)"
        assert final[b] == ref.final, f"sample {b}: final kept positions"
        assert tokens[b] == ref.tokens, f"sample {b}: tokens"


def assert_engine_matches_reference(lm, arch: str, policy, batch_size: int) -> None:
    """Eviction times, kept positions and tokens of the engine == the brute-force reference, per sample."""
    spec = spec_of(policy)
    refs = [reference(arch, tuple(p), spec) for p in PROMPTS]
    tokens, evictions, final, peak = run_engine(lm, PROMPTS, policy, batch_size)
    assert_traces_match(refs, tokens, evictions, final)
    if policy.schedule == "prefill_and_decode":
        assert peak <= policy.kv_size == max(r.peak for r in refs)  # never more than the budget
    else:
        assert peak == max(map(len, PROMPTS))  # decode_only holds the whole prompt first
    assert all(ref.evictions for ref in refs)  # every sample evicted at least once


@pytest.mark.parametrize("policy", [POLICIES[0], POLICIES[2]], ids=pid)
@pytest.mark.parametrize("chunk,score_chunk", [(5, 64), (32, 64), (None, 3), (7, 5)])
def test_chunked_forwards_match_reference(tiny_llama, policy, chunk, score_chunk):
    """Prefill chunks (no eviction inside the first block) and the query chunks of the score
    computation change nothing: the same pairs are kept, the same tokens generated."""
    refs = [reference("llama", tuple(p), spec_of(policy)) for p in PROMPTS]
    tokens, evictions, final, _ = run_engine(tiny_llama, PROMPTS, policy, 4, prefill_chunk=chunk, score_chunk=score_chunk)
    assert evictions == [r.evictions for r in refs]
    assert final == [r.final for r in refs]
    assert tokens == [r.tokens for r in refs]


def test_protected_pairs_survive_in_reference_and_engine(tiny_llama):
    """protect_first / protect_recent: every eviction keeps them, in both implementations."""
    policy = POLICIES[6]  # batch_max, protect_first=3, protect_recent=5
    _, evictions, _, _ = run_engine(tiny_llama, PROMPTS, policy, 4)
    for b, p in enumerate(PROMPTS):
        ref = reference("llama", tuple(p), spec_of(policy))
        for trace in (ref.evictions, evictions[b]):
            assert trace
            for seen, kept in trace:
                must = set(range(3)) | set(range(seen - 5, seen))
                assert all(must <= set(h) for heads in kept for h in heads)
    # ...and without the protections the rule evicts some of them
    plain = reference("llama", tuple(PROMPTS[0]), spec_of(POLICIES[0]))
    assert any(
        not (set(range(3)) | set(range(seen - 5, seen))) <= set(h) for seen, kept in plain.evictions for heads in kept for h in heads
    )


def test_engine_differs_from_window_and_between_policies(tiny_phi3):
    """The engine's kept sets are not a window's and depend on the rule (so the comparisons can fail)."""
    runs = {}
    for policy in (BatchMax(kv_size=32, evict_every=8), H2O(kv_size=32, evict_every=8, protect_recent=0,
                                                            schedule="prefill_and_decode"),
                   TOVA(kv_size=32, evict_every=8, schedule="prefill_and_decode"), Window(kv_size=32, evict_every=8)):
        _, evictions, _, _ = run_engine(tiny_phi3, PROMPTS[:1], policy, 1)
        runs[policy.name] = evictions[0]
    assert [s for s, _ in runs["batch_max"]] == [s for s, _ in runs["window"]]
    names = list(runs)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert runs[a] != runs[b], (a, b)


# ---------------------------------------------------------------------------- eviction alone, with ties


@pytest.mark.parametrize(
    "policy",
    [
        BatchMax(kv_size=16, evict_every=4),
        H2O(kv_size=16, evict_every=4, protect_recent=0),
        H2O(kv_size=16, evict_every=4, protect_first=2, protect_recent=3),
        TOVA(kv_size=16, evict_every=4),
    ],
    ids=pid,
)
def test_evict_with_exact_ties_matches_reference(policy):
    """Coarse statistics (multiples of 1/4) make many scores exactly equal: `KVCache.evict` must
    break ties like the reference (the older pair goes first), per (layer, head, sample)."""
    from kvbench.cache import KVCache

    B, H, D, L, T, keep = 3, 2, 4, 2, 20, 12
    cache = KVCache(batch_size=B, num_kv_heads=H, head_dim=D, capacity=T, dtype=torch.float64,
                    layer_devices=["cpu"] * L, track_attention=True)
    r = torch.tensor([20, 15, 18])  # samples hold different counts
    cache.begin_forward(r, T)
    g = torch.Generator().manual_seed(0)
    stats = []
    for layer in range(L):
        k = torch.randn(B, H, T, D, generator=g, dtype=torch.float64)  # (B, H_kv, T, D)
        cache.write(layer, k, k.clone())
        w_sum = torch.randint(0, 4, (B, H, T), generator=g).double() / 4  # (B, H_kv, N)
        w_last = torch.randint(0, 3, (B, H, T), generator=g).double() / 4
        cache.sink(layer).accumulate(w_sum, w_last)
        stats.append((w_sum, w_last))
    cache.evict(torch.ones(B, dtype=torch.bool), keep, policy)
    spec = spec_of(policy)
    for b in range(B):
        n = int(r[b])
        # statistics are indexed by cache slot; sample b's slot j holds its position j
        ref_cache = [
            [[R.Pair(j, None, None, float(ws[b, h, j]), float(wl[b, h, j])) for j in range(n)]
             for h in range(H)]
            for ws, wl in stats
        ]
        R.evict(ref_cache, spec, keep, n - 1)
        got = [cache.kept_positions(layer, b).tolist() for layer in range(L)]
        assert got == R.kept(ref_cache), f"sample {b}"
    # the ties are real: with all-equal scores the oldest pairs go
    flat = H2O(kv_size=16, evict_every=4, protect_recent=0)
    c2 = KVCache(batch_size=1, num_kv_heads=1, head_dim=D, capacity=T, dtype=torch.float64,
                 layer_devices=["cpu"], track_attention=True)
    c2.begin_forward(torch.tensor([T]), T)
    c2.write(0, torch.zeros(1, 1, T, D, dtype=torch.float64), torch.zeros(1, 1, T, D, dtype=torch.float64))
    c2.sink(0).accumulate(torch.full((1, 1, T), 0.5), torch.full((1, 1, T), 0.5))
    c2.evict(torch.ones(1, dtype=torch.bool), keep, flat)
    assert c2.kept_positions(0, 0).tolist() == [list(range(T - keep, T))]

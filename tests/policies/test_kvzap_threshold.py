"""KVzap by threshold (`head_budget=threshold`, kvbench.budgets.threshold_heads: DMS over KVzap's score at arrival).

After prefill it keeps kvpress's pairs and tokens (DMSPress over KVzapPress("linear"), the fixture
tests/data/kvpress_methods/kvzap_linear_dms.json). Under decode_only and prefill_and_decode (chunked prefill), in a
left-padded batch, each row keeps the pairs and decodes the tokens of a brute-force rule written from DMS's
decoding=True (`dms_trace`: whenever evict_every pairs have left the newest window, every pair older than the window
scoring below the threshold goes), over the reference model's recorded hidden states and tests/reference_select.dms.
"""

from __future__ import annotations

import math

import pytest
import torch

from kvbench.budgets.threshold_heads import threshold_counts
from kvbench.engine import generate
from kvbench.errors import ConfigError
from kvbench.policies.kvzap import KVzap
from tests import reference as R
from tests import reference_select as S
from tests.policies.test_expected_attention import run, tiny
from tests.policies.test_kvzap import scorer_folder
from tests.policies.test_reference_methods import fixture
from tests.policies.test_scored import NEW, PROMPTS, _ref_model
from tests.reference_methods import kvzap as kvzap_scores

INF = math.inf
THRESHOLD, WINDOW, EVERY = 0.0, 8, 4  # the tiny random scorer's outputs straddle 0


def test_counts_keep_the_window_and_what_scores_at_least_the_threshold():
    ranked = torch.tensor([[[[INF, INF, -1.0, 0.5, 2.0, -INF], [-3.0, -2.0, INF, -INF, -INF, -INF]]]])  # (1, 1, 2, 6)
    assert threshold_counts(ranked, 0.0).tolist() == [[[4, 1]]]  # +inf, 0.5 and 2.0 | +inf; -inf never
    assert threshold_counts(ranked, -INF).tolist() == [[[5, 3]]]  # nothing evicted, empty slots not counted
    assert threshold_counts(ranked, 0.5).tolist() == [[[4, 1]]]  # a score equal to the threshold stays


def test_after_prefill_keeps_kvpress_pairs_and_tokens(tmp_path):
    fx = fixture("kvzap_linear_dms")
    policy = KVzap(model_type="linear", head_budget="threshold", threshold=fx["args"]["threshold"],
                   sliding_window=fx["args"]["sliding_window_size"], schedule="after_prefill",
                   scorer=scorer_folder(tmp_path, "linear"))
    tokens, kept = run(tiny(), [fx["ids"]], policy, len(fx["tokens"]))
    assert kept[0] == fx["kept"] and tokens[0] == fx["tokens"]
    assert len({len(h) for layer in kept[0] for h in layer}) > 1  # heads keep different counts


def dms_trace(prompt: list[int], schedule: str) -> tuple[list[int], list[list[list[int]]]]:
    """(tokens, kept[layer][head] at the end) under DMS by threshold over the tiny llama's random KVzap scorer:
    prefill_and_decode processes the prompt in blocks (the first window + evict_every, then evict_every), decode_only
    whole; before each block or decode token of r tokens, when the pairs not yet decided + r exceed window +
    evict_every, every pair older than the newest window scoring below the threshold goes (decided once: a score
    fixed at arrival gives the same answer again)."""
    ref = _ref_model("llama")
    cfg, sd = R._tiny_kvzap(ref)
    ref.hidden = [[] for _ in ref.layers]
    cache, history = ref.new_cache(), ref.new_history()
    pending = 0

    def process(tokens: list[int], start: int):
        nonlocal pending
        pending += len(tokens)
        for i, tok in enumerate(tokens):
            logits = ref.step(tok, start + i, cache, history)
        return logits

    def before(r: int) -> None:
        nonlocal pending
        if pending + r <= WINDOW + EVERY:
            return
        for layer, heads in enumerate(cache):
            keep = S.dms(kvzap_scores(cfg, sd, layer, heads, ref.hidden[layer]), THRESHOLD, WINDOW)
            cache[layer] = [[pairs[i] for i in k] for pairs, k in zip(heads, keep, strict=True)]
        pending = WINDOW

    try:
        s = len(prompt)
        if schedule == "prefill_and_decode":
            t = min(s, WINDOW + EVERY)
            logits = process(prompt[:t], 0)
            while t < s:
                r = min(EVERY, s - t)
                before(r)
                logits = process(prompt[t : t + r], t)
                t += r
        else:
            logits = process(prompt, 0)
        tokens = [int(logits.argmax())]
        for i in range(1, NEW):
            before(1)
            tokens.append(int(process([tokens[-1]], s + i - 1).argmax()))
        return tokens, R.kept(cache)
    finally:
        ref.hidden = None


def engine_trace(lm, prompts, schedule: str, window: int = WINDOW):
    final = []

    def observer(event, cache):
        if event != "evict":
            final[:] = [[[[p for p in h if p >= 0] for h in cache.kept_positions(la, b).tolist()]
                         for la in range(cache.num_layers)] for b in range(len(prompts))]

    policy = KVzap(head_budget="threshold", threshold=THRESHOLD, sliding_window=window, evict_every=EVERY,
                   schedule=schedule)  # the tiny model has no name: the random scorer (seed 0)
    out = generate(lm.model, lm.tokenizer, prompts, policy, len(prompts), max_new_tokens=NEW, eos_token_ids=[],
                   observer=observer, prefill_chunk=5)
    return out.token_ids, final


@pytest.mark.parametrize("schedule", ["decode_only", "prefill_and_decode"])
def test_decoding_rows_keep_the_dms_rule(tiny_llama, schedule):
    tokens, final = engine_trace(tiny_llama, PROMPTS, schedule)
    for b, p in enumerate(PROMPTS):
        want_tokens, want_kept = dms_trace(p, schedule)
        assert final[b] == want_kept and tokens[b] == want_tokens, b
    counts = {len(h) for row in final for layer in row for h in layer}
    assert len(counts) > 2 and max(counts) < len(PROMPTS[0]) + NEW  # uneven, and something evicted


def test_the_window_is_protected(tiny_llama):
    """Without the window (1 pair), the same threshold keeps other pairs than the rule's (the defect shows)."""
    _, final = engine_trace(tiny_llama, PROMPTS[:1], "decode_only", window=1)
    assert final[0] != dms_trace(PROMPTS[0], "decode_only")[1]


@pytest.mark.parametrize("kw,key", [
    (dict(threshold=-5.0), "policy.threshold"),  # no head_budget=threshold
    (dict(head_budget="threshold"), "policy.threshold"),  # no threshold
    (dict(head_budget="threshold", threshold=-5.0, compression_ratio=0.5), "policy.compression_ratio"),
    (dict(head_budget="threshold", threshold=-5.0, kv_ratio=0.5), "policy.kv_ratio"),
    (dict(head_budget="threshold", threshold=-5.0, protect_recent=4), "policy.protect_recent"),
    (dict(head_budget="threshold", threshold=-5.0, sliding_window=0), "policy.sliding_window"),
    (dict(head_budget="threshold", threshold=-5.0, rerotate=True), "policy.head_budget"),
])
def test_refusals_name_the_key(kw, key):
    with pytest.raises(ConfigError) as e:
        KVzap(**kw)
    assert e.value.key == key


def test_scores_recomputed_at_each_eviction_are_refused():
    from kvbench.policies.snapkv import SnapKV

    with pytest.raises(ConfigError, match="not stored once at arrival"):
        SnapKV(head_budget="threshold")


def test_the_threshold_replaces_the_budget():
    p = KVzap(head_budget="threshold", threshold=-5.0)
    assert p.kv_size is None and p.evicts and p.describe()["extensions"][0].startswith("head_budget=threshold")


def test_the_record_carries_the_share_really_kept(tiny_llama):
    """kv_kept_share: 1 when nothing scores below the threshold, else each head's own count over what the tokens
    brought (the kept positions counted independently, holes left out)."""
    counted = []

    def observer(event, cache):
        if event != "evict":
            counted[:] = [sum(len([p for p in h if p >= 0]) for la in range(cache.num_layers)
                              for h in cache.kept_positions(la, b).tolist()) for b in range(len(PROMPTS))]

    shares = []
    for t in (-INF, THRESHOLD):
        policy = KVzap(head_budget="threshold", threshold=t, sliding_window=WINDOW, schedule="after_prefill")
        out = generate(tiny_llama.model, tiny_llama.tokenizer, PROMPTS, policy, len(PROMPTS), max_new_tokens=NEW,
                       eos_token_ids=[], observer=observer)
        cfg = tiny_llama.model.config
        brought = sum(len(p) + NEW - 1 for p in PROMPTS) * cfg.num_hidden_layers * cfg.num_key_value_heads
        assert out.kv_kept_share == round(sum(counted) / brought, 4)
        shares.append(out.kv_kept_share)
    assert shares[0] == 1.0 and shares[1] < 0.9


def test_serve_keeps_the_static_engines_tokens(tiny_llama, monkeypatch):
    """Serve mode (after_prefill): each (layer, KV head) of a request keeps the threshold's count, its own pages
    (1-slot blocks, requests preempted mid-generation): the static engine's tokens."""
    from tests.serve.test_engine import assert_preempted_serve_is_static

    policy = KVzap(head_budget="threshold", threshold=THRESHOLD, sliding_window=4, schedule="after_prefill")
    assert_preempted_serve_is_static(tiny_llama, policy, monkeypatch)


@pytest.mark.parametrize("schedule", ["after_prefill", "decode_only"])
def test_query_agnostic_context_is_thresholded_before_its_question(tiny_llama, schedule):
    """task.query_aware=false: the context is decided before the question (its newest window kept), whatever the
    question's length (no budget to make room in), the same pairs as the context alone at its first eviction."""
    contexts, question = PROMPTS[:3], [5, 20, 12]  # contexts of 70, 24, 45 tokens; questions from them
    kept = {}
    for with_question in (False, True):
        got = []

        def observer(event, cache, got=got):
            if event == "evict":
                got.append([[[[p for p in h if p >= 0] for h in cache.kept_positions(la, b).tolist()]
                              for la in range(cache.num_layers)] for b in range(len(contexts))])

        prompts = [c + c[:q] for c, q in zip(contexts, question, strict=True)] if with_question else contexts
        policy = KVzap(head_budget="threshold", threshold=THRESHOLD, sliding_window=WINDOW, evict_every=EVERY,
                       schedule=schedule)
        generate(tiny_llama.model, tiny_llama.tokenizer, prompts, policy, len(prompts), max_new_tokens=4,
                 eos_token_ids=[], observer=observer, question_tokens=question if with_question else None)
        kept[with_question] = got[0]
    assert kept[True] == kept[False]
    assert sum(len(h) for row in kept[True] for layer in row for h in layer) < sum(map(len, contexts)) * 2 * 2


def test_the_report_names_the_threshold_in_the_kv_cell():
    from kvbench.report.rows import budget_of

    assert budget_of({"kv_size": None, "config": {"policy": {"threshold": -5.0}}}) == "threshold=-5"
    assert budget_of({"kv_size": 256, "config": {"policy": {"threshold": None}}}) is None

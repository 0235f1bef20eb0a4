"""DuoAttention (kvbench.policies.duo_attention): retrieval heads keep every pair, streaming heads their sinks and
newest pairs, once after prefill. Against kvpress 0.5.5 on its tiny model (tests/data/kvpress_methods/
duo_attention.json): the on-the-fly head scores calibrated on local texts, and a published-layout pattern folder
written here (nothing downloaded), keep kvpress's pairs and decode its tokens; a left-padded batch keeps the
brute-force rule (tests/reference_select.duo_streaming / duo_kept) row by row; the schedules and knobs it refuses."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvbench.engine import generate
from kvbench.errors import ConfigError
from kvbench.policies.duo_attention import DuoAttention, head_pattern
from tests import kvpress_tiny as T
from tests import reference_select as S
from tests.policies.test_expected_attention import tiny
from tests.policies.test_reference_methods import close, fixture


def run(model, prompts, policy, new, tok=None):
    """Tokens, and per compression the kept positions [row][layer][kv head] (a retrieval head keeps every pair, so
    a row's count need not drop: every row is read at each eviction event)."""
    kept = []

    def observer(event, cache):
        if event == "evict":
            kept.append([[[[p for p in h if p >= 0] for h in cache.kept_positions(la, b).tolist()]
                          for la in range(cache.num_layers)] for b in range(len(prompts))])

    out = generate(model, tok or T.CharTokenizer(), prompts, policy, len(prompts), max_new_tokens=new,
                   eos_token_ids=[], observer=observer)
    return out.token_ids, kept


def calibration_file(tmp_path, texts, kind="json"):
    f = tmp_path / f"calibration.{kind}"
    if kind == "json":
        f.write_text(json.dumps(texts))
    else:  # jsonl, one object a line (its text in "article", as CNN/DM's rows)
        f.write_text("".join(json.dumps({"id": i, "article": t}) + "\n" for i, t in enumerate(texts)))
    return str(f)


def pattern_folder(tmp_path, scores, sink, recent):
    (tmp_path / "config.json").write_text(json.dumps({"sink_size": sink, "recent_size": recent}))
    (tmp_path / "full_attention_heads.tsv").write_text("".join("\t".join(map(str, row)) + "\n" for row in scores))
    return str(tmp_path)


@pytest.mark.parametrize("kind", ["json", "jsonl"])
def test_on_the_fly_keeps_kvpress_pairs_and_tokens(tmp_path, kind):
    fx = fixture("duo_attention")
    policy = DuoAttention(calibration=calibration_file(tmp_path, fx["texts"], kind), num_samples=fx["num_samples"],
                          q_len=fx["q_len"], sink_size=fx["sink_size"], recent_size=fx["recent_size"],
                          compression_ratio=fx["ratio"])  # read as head_compression_ratio
    model = tiny()
    close(head_pattern(policy, model.config, model, T.CharTokenizer()).scores.tolist(), fx["head_scores"])
    tokens, kept = run(model, [fx["ids"]], policy, len(fx["tokens"]))
    assert len(kept) == 1 and kept[0][0] == fx["kept"]
    assert tokens[0] == fx["tokens"]


def test_published_pattern_folder_keeps_kvpress_pairs_and_tokens(tmp_path):
    fx = fixture("duo_attention")
    folder = pattern_folder(tmp_path, fx["head_scores"], fx["sink_size"], fx["recent_size"])
    policy = DuoAttention(patterns=folder, head_compression_ratio=fx["ratio"])  # the windows from config.json
    tokens, kept = run(tiny(), [fx["ids"]], policy, len(fx["tokens"]))
    assert kept[0][0] == fx["kept"] and tokens[0] == fx["tokens"]
    assert policy.window == fx["sink_size"] + fx["recent_size"]


def test_left_padded_batch_keeps_the_rule_row_by_row(tmp_path):
    """Rows of different lengths, some shorter than the window (nothing to cut): each keeps duo_kept of its own
    length; three of the four (layer, head) pairs streaming (ratio 0.75)."""
    fx = fixture("duo_attention")
    folder = pattern_folder(tmp_path, fx["head_scores"], 3, 5)
    prompts = [T.prompt_ids(40, seed=1), T.prompt_ids(7, seed=4), T.prompt_ids(23, seed=7)]
    policy = DuoAttention(patterns=folder, head_compression_ratio=0.75)
    _, kept = run(tiny(), prompts, policy, 4)
    mask = S.duo_streaming(fx["head_scores"], 0.75)
    assert sum(map(sum, mask)) == 3
    for b, p in enumerate(prompts):
        assert kept[0][b] == [S.duo_kept(len(p), row, 3, 5) for row in mask], b


@pytest.mark.parametrize("schedule", ["after_prefill", "prefill_and_decode", "decode_only"])
def test_head_compression_ratio_zero_keeps_every_pair(tmp_path, schedule):
    """No streaming head: nothing is evicted, under every schedule, query-agnostic too (the question then needs no
    room in a streaming head's window: issue 58), and the tokens are the full cache's."""
    from kvbench.policies import Full

    fx = fixture("duo_attention")
    folder = pattern_folder(tmp_path, fx["head_scores"], 2, 4)
    for question in (None, [6]):
        policy = DuoAttention(patterns=folder, compression_ratio=0.0, schedule=schedule)
        assert not policy.evicts
        kw = dict(max_new_tokens=3, eos_token_ids=[], question_tokens=question)
        seen = []
        out = generate(tiny(), T.CharTokenizer(), [fx["ids"]], policy, observer=lambda e, c, seen=seen: seen.append(e), **kw)
        assert "evict" not in seen
        assert out.token_ids == generate(tiny(), T.CharTokenizer(), [fx["ids"]], Full(), **kw).token_ids


def test_a_nameless_model_gets_random_scores_and_small_windows():
    model = tiny()
    p = head_pattern(DuoAttention(), model.config)
    assert p.scores.shape == (T.CONFIG["num_hidden_layers"], T.CONFIG["num_key_value_heads"])
    assert np.array_equal(p.scores, np.random.default_rng(0).random(p.scores.shape))
    assert (p.sink_size, p.recent_size) == (2, 10)


@pytest.mark.parametrize("kw,key", [
    (dict(schedule="prefill_and_decode", evict_every=256), "policy.evict_every"),
    (dict(kv_ratio=0.5), "policy.kv_ratio"),
    (dict(kv_size=8), "policy.kv_size"),
    (dict(head_compression_ratio=1.5), "policy.head_compression_ratio"),
    (dict(q_len=0), "policy.q_len"),
    (dict(patterns="x", calibration="y"), "policy.calibration"),
    (dict(head_budget="uniform"), "policy.head_budget"),
])
def test_refused_in_one_line(kw, key):
    with pytest.raises(ConfigError) as e:
        DuoAttention(**kw)
    assert e.value.key == key


def test_calibration_file_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    model = tiny()
    for path in (str(bad), str(tmp_path / "missing.txt")):
        with pytest.raises(ConfigError) as e:
            head_pattern(DuoAttention(calibration=path), model.config, model, T.CharTokenizer())
        assert e.value.key == "policy.calibration"


def test_compression_ratio_is_the_head_share():
    p = DuoAttention(compression_ratio=0.25)
    assert (p.kv_size, p.compression_ratio, p.head_compression_ratio) == (None, 0.25, 0.25)
    ext = p.describe()["extensions"]
    assert any("read as head_compression_ratio" in e for e in ext) and not any("int(its prompt" in e for e in ext)


def test_serve_frees_streaming_heads_pages_and_gives_the_static_tokens(tiny_llama):
    """Serve mode: each (layer, KV head) owns its pages; after the compression a streaming head gives its pages back
    (blocks evicted) and the tokens are the static engine's (half the heads streaming, a pool that never preempts)."""
    from kvbench.serve.engine import serve
    from tests.conftest import random_prompts
    from tests.serve.test_engine import requests

    policy = DuoAttention(head_compression_ratio=0.5)  # the nameless tiny llama: random scores, sink 2, recent 10
    prompts = random_prompts((28, 24, 28, 14), seed=21)
    want = generate(tiny_llama.model, tiny_llama.tokenizer, prompts, policy, 1, max_new_tokens=8,
                    eos_token_ids=[]).token_ids
    reqs = requests(prompts, 8)
    out = serve(tiny_llama.model, reqs, policy, num_blocks=400, block_size=1, max_tokens_per_step=32)
    assert out.evicted_blocks > 0 and [r.output for r in reqs] == want


@pytest.mark.parametrize("schedule", ["after_prefill", "prefill_and_decode"])
def test_the_budgets_recorded_are_what_each_head_held(tiny_llama, tmp_path, schedule):
    """The static run's budgets (the record's kv_budget) are, per (layer, sample), the mean over its KV heads of what
    each head may hold, as serve mode records them: a retrieval head the whole sequence, a streaming head its window
    (under after_prefill at most its prompt). Layer 0's heads stream, layer 1's retrieve (issue 58: the record said
    the window alone, min = max, while the retrieval heads held every pair)."""
    from types import SimpleNamespace

    from kvbench.budgets import head_rule
    from tests.conftest import random_prompts

    policy = DuoAttention(patterns=pattern_folder(tmp_path, [[0.1, 0.2], [0.9, 0.8]], 2, 9), schedule=schedule,
                          head_compression_ratio=0.5, evict_every=3)
    prompts, new = random_prompts((30, 7, 19), seed=3), 5
    out = generate(tiny_llama.model, tiny_llama.tokenizer, prompts, policy, 3, max_new_tokens=new, eos_token_ids=[])
    window = [min(len(p), 11) if schedule == "after_prefill" else 11 for p in prompts]
    assert (out.budget_min, out.budget_max, out.budget_per_layer) == (min(window), 30 + new, True)
    served = head_rule(policy).head_budgets(policy, tiny_llama.model.config)  # serve mode's, per request (L, H)
    means = [served(SimpleNamespace(prompt=p, max_new_tokens=new)).float().mean(1) for p in prompts]
    assert (out.budget_min, out.budget_max) == (min(int(m.min()) for m in means), max(int(m.max()) for m in means))


def sliding_reference(ref, prompt, new, streaming, sink, window, p, schedule):
    """Brute force, from the method: retrieval heads hold every pair; every streaming head is Algorithm 1 with the
    newest pairs kept (its `sink` first positions protected), budget `window`, `p` pairs at a time (decode_only: the
    whole prompt first). Returns (tokens, final kept positions [layer][head])."""
    cache = ref.new_cache()
    heads = [(la, g) for la, row in enumerate(streaming) for g, s in enumerate(row) if s]

    def evict(keep):
        for la, g in heads:
            pairs = cache[la][g]
            sinks = [x for x in pairs if x.pos < sink]
            cache[la][g] = sinks + [x for x in pairs if x.pos >= sink][len(pairs) - keep:]

    size = lambda: len(cache[heads[0][0]][heads[0][1]]) if heads else 0  # noqa: E731
    s, logits = len(prompt), None
    t1 = min(s, window) if schedule == "prefill_and_decode" else s
    for pos in range(t1):
        logits = ref.step(prompt[pos], pos, cache)
    while t1 < s:  # Algorithm 1's blocks of p
        evict(size() - p)
        t0, t1 = t1, min(s, t1 + p)
        for pos in range(t0, t1):
            logits = ref.step(prompt[pos], pos, cache)
    tokens = [int(logits.argmax())]
    for t in range(1, new):
        if size() >= window:
            evict(window - p)
        tokens.append(int(ref.step(tokens[-1], s + t - 1, cache).argmax()))
    return tokens, [[[x.pos for x in pairs] for pairs in layer] for layer in cache]


@pytest.mark.parametrize("schedule", ["prefill_and_decode", "decode_only"])
def test_streaming_heads_slide_while_running(tiny_llama, tmp_path, schedule):
    """Under prefill_and_decode / decode_only a streaming head keeps its sinks and slides over its window as tokens
    arrive; a retrieval head never evicts: tokens and final kept pairs of a left-padded batch, row by row."""
    from tests.policies.test_scored import _ref_model

    cfg = tiny_llama.model.config
    scores = np.random.default_rng(5).random((cfg.num_hidden_layers, cfg.num_key_value_heads)).tolist()
    policy = DuoAttention(patterns=pattern_folder(tmp_path, scores, 2, 9), head_compression_ratio=0.5,
                          schedule=schedule, evict_every=3)
    from tests.conftest import random_prompts

    prompts = random_prompts((30, 11, 19), seed=3)
    final = {}

    def observer(event, cache):
        final.update({b: [[[q for q in h if q >= 0] for h in cache.kept_positions(la, b).tolist()]
                          for la in range(cache.num_layers)] for b in range(len(prompts))})

    out = generate(tiny_llama.model, tiny_llama.tokenizer, prompts, policy, len(prompts), max_new_tokens=12,
                   eos_token_ids=[], observer=observer)
    streaming = S.duo_streaming(scores, 0.5)
    for b, p in enumerate(prompts):
        tokens, kept = sliding_reference(_ref_model("llama"), p, 12, streaming, 2, 11, 3, schedule)
        assert out.token_ids[b] == tokens and final[b] == kept, b


@pytest.mark.parametrize("schedule", ["prefill_and_decode", "decode_only"])
def test_served_streaming_heads_slide_and_free_their_pages(tiny_llama, tmp_path, schedule):
    """Serve mode under the schedules that evict while running: the pattern fixes each (layer, KV head)'s budget
    before any score (a retrieval head the whole request, a streaming head its window), so a streaming head frees
    its own pages as the request grows, during a served prefill too. Tokens: the brute-force sliding rule's (pages of
    p = evict_every pairs, chunks of p, one request at a time: the reference's blocks of p); pages: the streaming
    heads' windows and the retrieval heads' whole requests at most while decoding (and, under prefill_and_decode, over
    the whole run), below what compressing after prefill holds (its streaming heads grow while decoding)."""
    from kvbench.serve.engine import serve
    from tests.conftest import random_prompts
    from tests.policies.test_scored import _ref_model
    from tests.serve.test_engine import requests

    cfg = tiny_llama.model.config
    L, H = cfg.num_hidden_layers, cfg.num_key_value_heads
    scores = np.random.default_rng(5).random((L, H)).tolist()
    sink, recent, p, new = 3, 9, 3, 12  # sink and window whole pages of p
    folder = pattern_folder(tmp_path, scores, sink, recent)
    # decode_only's first eviction cuts a whole prompt in whole pages: one ending mid-page keeps that page's pairs
    prompts = random_prompts((30, 11, 19 if schedule == "prefill_and_decode" else 18), seed=3)
    streaming = S.duo_streaming(scores, 0.5)
    peaks = {}
    for sched in ("after_prefill", schedule):
        policy = DuoAttention(patterns=folder, head_compression_ratio=0.5, schedule=sched, evict_every=p)
        reqs = requests(prompts, new)
        out = serve(tiny_llama.model, reqs, policy, num_blocks=400, block_size=p, max_tokens_per_step=p, max_running=1)
        peaks[sched] = out.peak_pages, max(out.decode_pages)  # over the whole run, over decode steps
    for b, prompt in enumerate(prompts):  # the last run's: `schedule`
        assert reqs[b].output == sliding_reference(_ref_model("llama"), prompt, new, streaming, sink, sink + recent, p,
                                                   schedule)[0], b
    n_stream = sum(map(sum, streaming))
    longest = max(map(len, prompts)) + new - 1  # a request's KV never holds its last token
    bound = (L * H - n_stream) * -(-longest // p) + n_stream * (sink + recent) // p  # pages of one request at most
    assert peaks[schedule][1] <= bound < peaks["after_prefill"][1]  # while decoding: the windows, not their growth
    if schedule == "prefill_and_decode":  # the prompt never held whole: neither is the peak
        assert peaks[schedule][0] <= bound < peaks["after_prefill"][0]


@pytest.mark.parametrize("schedule", ["prefill_and_decode", "decode_only"])
def test_account_follows_the_cache_while_streaming_heads_slide(tiny_llama, monkeypatch, schedule):
    """The memory account's cache at every forward is the allocation's, and its peak bounds the measured one, while
    the streaming heads evict again and again (the registry's test runs the default, after_prefill)."""
    from tests.memory import test_account_registry as account

    monkeypatch.setattr(account, "_at_test_size", lambda name: DuoAttention(schedule=schedule, evict_every=4))
    account.check_account("duo_attention", tiny_llama, monkeypatch)


def test_preflight_refuses_a_model_without_a_pattern_from_its_config(tmp_path):
    """`check_policy` (the preflight, from the model's config: no weights, nothing fetched) refuses a named model
    kvpress has no pattern for unless a calibration file or a pattern folder of the model's shape is given; the
    Hub's newer name for Llama-3.1-8B-Instruct is kvpress's pattern (the same weights)."""
    from kvbench.artifacts import duo_patterns
    from kvbench.models.family.adapter import check_policy

    config = tiny().config
    config.name_or_path = "Qwen/Qwen3-8B"
    with pytest.raises(ConfigError) as e:
        check_policy(config, DuoAttention(), 64)
    assert e.value.key == "policy.patterns" and "Qwen/Qwen3-8B" in str(e.value)  # a key that exists (issue 58)
    assert str(e.value).startswith("policy.patterns: ")  # not set: no value to show
    check_policy(config, DuoAttention(calibration=str(tmp_path / "texts.json")), 64)  # read when the model is loaded
    L, H = T.CONFIG["num_hidden_layers"], T.CONFIG["num_key_value_heads"]
    check_policy(config, DuoAttention(patterns=pattern_folder(tmp_path, np.ones((L, H)), 2, 8)), 64)
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    for patterns, match in ((pattern_folder(wrong, np.ones((L + 1, H)), 2, 8), "pattern shape"),
                            ("Qwen/Qwen3-8B", "no published pattern")):
        with pytest.raises(ConfigError, match=match) as e:
            check_policy(config, DuoAttention(patterns=patterns), 64)
        assert e.value.key == "policy.patterns"
    for name in ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Meta-Llama-3.1-8B-Instruct"):
        config.name_or_path = name
        check_policy(config, DuoAttention(), 64)
        assert duo_patterns.known(name) == "meta-llama/Meta-Llama-3.1-8B-Instruct"
    assert duo_patterns.known("Qwen/Qwen3-8B") is None

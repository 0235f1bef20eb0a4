"""RULER's synthetic tasks (kvbench/tasks/ruler.py) and query-agnostic compression (`task.query_aware=false`).

Tasks: deterministic from the seed (same seed, same prompts; a smaller run is a prefix), sized in the
model's tokens (prompt + tokens_to_generate <= context_length, and close to it), the references hidden in
the prompt, the question found, RULER's string_match_all. Query-agnostic: with the full cache the tokens
are the query-aware run's; with a query-aware policy (SnapKV) the pairs kept from the context do not
depend on the question, and every question token is in the cache at the first generated token.
"""

from __future__ import annotations

import sys

import pytest

from kvbench import cli
from kvbench.engine import generate
from kvbench.errors import ConfigError
from kvbench.models.tiny import byte_tokenizer
from kvbench.policies import H2O, Full, SnapKV, StreamingLLM
from kvbench.results import read_jsonl, read_records
from kvbench.tasks import RULER_TASKS, TASKS
from kvbench.tasks.ruler_text import string_match_all, string_match_part

TOK = byte_tokenizer()  # one token per byte: context_length counts bytes of the rendered prompt


@pytest.mark.parametrize("name", sorted(RULER_TASKS))
def test_ruler_task_is_seeded_sized_and_holds_its_answers(name, shards):
    cls = RULER_TASKS[name]
    length = {"vt": 4000, "niah_multikey_3": 2600, "cwe": 3200, "fwe": 2000}.get(name, 1400)
    task = cls(n_samples=3, context_length=length, seed=5, data_dir=shards)
    samples = task.samples(TOK)
    again = cls(n_samples=2, context_length=length, seed=5, data_dir=shards).samples(TOK)
    assert [s.prompt for s in again] == [s.prompt for s in samples[:2]]  # deterministic, a prefix
    other = cls(n_samples=2, context_length=length, seed=6, data_dir=shards).samples(TOK)
    assert [s.prompt for s in other] != [s.prompt for s in again]
    for s in samples:
        n = len(task.encode(TOK, s.prompt))
        assert n + task.gen_tokens <= length
        assert n + task.gen_tokens > 0.8 * length, (n, length)  # the haystack fills the context
        context = s.prompt[: s.question_at]
        found = any if task.metric == "string_match_part" else all  # QA: any of the reference answers
        assert s.references and found(r in context for r in s.references), s.references
        assert 0 < s.question_at < len(s.prompt)
    assert task.describe()["extensions"] and task.metric == ("string_match_part" if name.startswith("qa") else "string_match_all")


def test_string_match_all_is_rulers():
    # RULER: sum(r.lower() in pred.lower() for r in ref) / len(ref), per sample
    assert string_match_all("The numbers are 123 and 456.", ["123", "456", "789", "000"]) == 0.5
    assert string_match_all("  ANSWER: Foo-Bar\x01", ["foo-bar"]) == 1.0
    assert string_match_all("", ["1"]) == 0.0
    t = TASKS["niah_multivalue"](n_samples=1, context_length=500)
    assert t.score(t.extract("1, 2 and 3"), ["1", "2", "3", "4"]) == {"string_match_all": 0.75}
    # RULER's QA metric: max over the references, per sample
    assert string_match_part("It was Keeper01.", ["keeper01", "nobody"]) == 1.0
    assert string_match_part("nobody knows", ["Keeper01"]) == 0.0
    qa = TASKS["qa_1"](n_samples=1, context_length=500)
    assert qa.metric == "string_match_part" and qa.score("Keeper01", ["x", "keeper01"]) == {"string_match_part": 1.0}


def test_niah_depth_places_the_needle():
    t = TASKS["niah_single_1"](n_samples=2, context_length=2000, depth=0.0)
    first = t.samples(TOK)[0]
    needle = first.prompt.index("One of the special magic")
    assert needle < first.prompt.index("The grass is green")
    t = TASKS["niah_single_1"](n_samples=2, context_length=2000, depth=1.0)
    last = t.samples(TOK)[0]
    assert last.prompt.index("One of the special magic") > last.prompt.rindex("The grass is green")
    assert first.meta["depths"] == [0.0] and last.meta["depths"] == [1.0]


def test_bad_ruler_settings_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"data.dir=.*: has no paul_graham_essays/train.jsonl.gz \(or .jsonl\), "
                       r"which task.haystack=essay reads .*, or task.haystack=noise$"):
        TASKS["niah_single_2"](data_dir=str(tmp_path))  # a data.dir without the essays: no silent fall-back
    with pytest.raises(ConfigError, match="data.dir=.*: has no cnn_dailymail/test.jsonl.gz .* task.haystack=cnndm"):
        TASKS["niah_single_1"](haystack="cnndm", data_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="task.haystack=noise: cwe has no haystack"):
        TASKS["cwe"](haystack="noise")
    with pytest.raises(ConfigError, match="task.haystack=needle: must be one of noise, essay, cnndm or null"):
        TASKS["vt"](haystack="needle")
    with pytest.raises(ConfigError, match="task.depth=0.5: qa_1 places no needle"):
        TASKS["qa_1"](depth=0.5)
    with pytest.raises(ConfigError, match="task.tokens_to_generate"):
        TASKS["niah_single_1"](tokens_to_generate=0)
    with pytest.raises(ConfigError, match="task.context_length"):
        TASKS["niah_single_1"](n_samples=1, context_length=100).samples(TOK)
    with pytest.raises(ConfigError, match="task.query_aware"):
        TASKS["cnndm"](query_aware=False)


def _question_split(name="niah_single_1", n=4, length=700, **kw):
    task = TASKS[name](n_samples=n, context_length=length, query_aware=False, tokens_to_generate=8, **kw)
    samples = task.samples(TOK)
    ids = [task.encode(TOK, s.prompt) for s in samples]
    return task, samples, ids, [task.question_tokens(TOK, s, x) for s, x in zip(samples, ids, strict=True)]


def test_question_tokens_are_the_prompt_tail():
    task, samples, ids, q = _question_split()
    for s, x, n in zip(samples, ids, q, strict=True):
        assert TOK.decode(x[-n:]) == s.prompt[s.question_at:]  # byte tokens: exactly the question part
    task.query_aware = True
    assert task.question_tokens(TOK, samples[0], ids[0]) == 0


@pytest.mark.parametrize("schedule", ["prefill_and_decode", "decode_only", "after_prefill"])
def test_query_agnostic_full_cache_equals_query_aware(tiny_llama, schedule):
    _, _, ids, q = _question_split()
    a = generate(tiny_llama.model, tiny_llama.tokenizer, ids, Full(), 2, max_new_tokens=6, eos_token_ids=[])
    b = generate(tiny_llama.model, tiny_llama.tokenizer, ids, Full(), 2, max_new_tokens=6, eos_token_ids=[],
                 question_tokens=q)
    assert a.token_ids == b.token_ids


class Kept:
    """The positions layer 0 keeps per sample at each forward, and the cache size."""

    def __init__(self):
        self.forwards = []

    def __call__(self, event, cache):
        if event == "forward":
            B = cache.seen.shape[0]
            self.forwards.append([(int(cache.seen[b]), cache.kept_positions(0, b).clone()) for b in range(B)])


@pytest.mark.parametrize("policy", [
    SnapKV(kv_size=256, window=8, kernel=5, evict_every=16, schedule="after_prefill"),
    SnapKV(kv_size=256, window=8, kernel=5, evict_every=16, schedule="decode_only"),
    H2O(kv_size=256, evict_every=16, protect_recent=8),
    StreamingLLM(kv_size=256, evict_every=16, protect_first=4),
], ids=lambda p: f"{p.name}-{p.schedule}")
def test_query_agnostic_context_ignores_the_question(tiny_llama, policy):
    """Two prompts with one context and different questions keep the same context pairs (under after_prefill;
    otherwise the longer question leaves room for fewer, a subset); every question token is held when the first
    token is generated; the budget holds."""
    task, samples, ids, q = _question_split(n=1)
    ctx = ids[0][: -q[0]]
    other = TOK("What is the special magic number for somebody else, please?<|im_end|>\n",
                add_special_tokens=False)["input_ids"]
    prompts, qs = [ids[0], ctx + other], [q[0], len(other)]
    kept = []
    for p, n in zip(prompts, qs, strict=True):
        w = Kept()
        generate(tiny_llama.model, tiny_llama.tokenizer, [p], policy, 1, max_new_tokens=3, eos_token_ids=[],
                 question_tokens=[n], observer=w)
        seen, pos = next(f[0] for f in w.forwards if f[0][0] == len(p))  # the question's forward
        held = set(pos[0].tolist())
        assert set(range(len(ctx), len(p))) <= held  # every question token is in the cache
        budget = policy.kv_size + (n if policy.once else 0)
        assert pos.shape[1] <= budget
        kept.append([sorted(x for x in h.tolist() if x < len(ctx)) for h in pos])  # per KV head
    # the same scores over the same context: the pairs kept for the longer question are among those kept for the
    # shorter (after_prefill: the same budget, the same pairs)
    small, large = sorted(kept, key=lambda k: len(k[0]))
    assert all(set(a) <= set(b) for a, b in zip(small, large, strict=True))
    if policy.once:
        assert kept[0] == kept[1]


def test_query_agnostic_run_from_the_cli(tmp_path, monkeypatch):
    args = ["model=tiny-llama", "task=niah_single_1", "task.n_samples=4", "task.context_length=600",
            "task.tokens_to_generate=8", "task.query_aware=false", "gen.max_new_tokens=8", "batch_size=2",
            "policy=snapkv", "policy.kv_size=128", "policy.schedule=after_prefill", f"results_dir={tmp_path}"]
    monkeypatch.setattr(sys, "argv", ["kvbench"])
    cli.main(args)
    (rec,) = read_records(tmp_path)
    assert rec["status"] == "ok" and rec["query_aware"] is False and rec["task"] == "niah_single_1"
    assert "string_match_all" in rec["metrics"] and "string_match_all_ci" in rec["metrics"]
    assert any("query_aware=false" in e for e in rec["extensions"])
    assert any(e.startswith("task: ") for e in rec["extensions"])
    assert rec["max_new_tokens"] == 8 and "task: generates at most 8 new tokens (gen.max_new_tokens; RULER's " \
        "niah_single_1: 128): a longer answer is cut" in rec["extensions"]
    cli.main([*args[:-1], f"results_dir={tmp_path / 'again'}"])  # the same seed: the same prompts and tokens
    (again,) = read_records(tmp_path / "again")
    first, second = (read_jsonl(r["predictions_path"]) for r in (rec, again))
    assert [(r["prompt"], r["token_ids"]) for r in first] == [(r["prompt"], r["token_ids"]) for r in second]
    with pytest.raises(SystemExit) as exc:
        cli.main([*args, "mode=serve"])
    assert exc.value.code == 2


def test_a_ruler_run_generates_rulers_length_unless_told(tmp_path, monkeypatch):
    """No gen.max_new_tokens: the run may generate RULER's 50 tokens (fwe), its record says so, and no
    departure; a smaller gen.max_new_tokens is recorded as one."""
    args = ["model=tiny-llama", "task=fwe", "task.n_samples=2", "task.context_length=800", "batch_size=2",
            "gen.ignore_eos=true", "policy=full"]
    monkeypatch.setattr(sys, "argv", ["kvbench"])
    cli.main([*args, f"results_dir={tmp_path / 'own'}"])
    (rec,) = read_records(tmp_path / "own")
    assert rec["status"] == "ok" and rec["max_new_tokens"] == rec["config"]["gen"]["max_new_tokens"] == 50
    assert rec["generated_tokens"] == 2 * 50 and not any("generates at most" in e for e in rec["extensions"])
    cli.main([*args, "gen.max_new_tokens=16", f"results_dir={tmp_path / 'cut'}"])
    (cut,) = read_records(tmp_path / "cut")
    assert cut["max_new_tokens"] == 16 and any("generates at most 16 new tokens" in e for e in cut["extensions"])


@pytest.mark.parametrize("extra,fragment", [
    ([], "task.haystack=essay: Paul Graham's essays (baber/paul_graham_essays) could not be read from the Hugging "
         "Face Hub"),  # no data.dir: the Hub, offline here
    (["data.dir={empty}"], "has no paul_graham_essays/train.jsonl.gz (or .jsonl), which task.haystack=essay reads"),
])
def test_the_cli_refuses_an_essay_task_without_its_essays(extra, fragment, tmp_path, capsys, monkeypatch):
    """One line, exit 2, before any model loads (the preflight renders the prompts with the tokenizer alone)."""
    from tests.conftest import assert_one_line_exit_2

    monkeypatch.setattr(sys, "argv", ["kvbench"])
    argv = ["model=tiny-llama", "task=niah_single_2", "task.n_samples=1", "task.context_length=600",
            f"results_dir={tmp_path}", *(e.format(empty=tmp_path) for e in extra)]
    assert_one_line_exit_2(cli.main, argv, capsys, fragment)
    assert not (tmp_path / "runs.jsonl").exists()

"""CNN/DailyMail, NarrativeQA and GSM8K on tiny mirrors written here (Hub column layout, gzip and
plain JSON lines): reading rows, drawing samples and exemplars, building and cutting prompts,
extracting answers and scoring them, and the errors a bad configuration gets before a model loads."""

from __future__ import annotations

import gzip
import json
import random
import sys

import pytest
from hydra import compose, initialize_config_dir

from kvbench import cli
from kvbench import run as kvrun
from kvbench.config import CONF_DIR, build_task, prepare
from kvbench.errors import ConfigError
from kvbench.results import read_jsonl, read_records
from kvbench.tasks import CNNDM, GSM8K, NarrativeQA, answer_metrics, data
from kvbench.tasks.fewshot import permutation
from kvbench.tasks.narrativeqa import answer_texts


# ----------------------------------------------------------------------------- fixtures
def cnndm_rows(split: str, n: int) -> list[dict]:
    rows = []
    for i in range(n):
        body = " ".join(f"Sentence {k} of the {split} story {i} about topic{i}." for k in range(5 + 4 * i))
        rows.append({
            "article": f"(CNN){body}",
            "highlights": f"Topic{i} of {split} story {i} happened .\nIt was reported on day {i} .",
            "id": f"{split}{i}",
        })
    return rows


def narrativeqa_rows(split: str, n_docs: int, per_doc: int = 2) -> list[dict]:
    rows = []
    for d in range(n_docs):
        summary = " ".join(f"In chapter {k} , {split}hero{d} travels to town{k} ." for k in range(6 + 3 * d))
        for q in range(per_doc):
            rows.append({
                "document": {"id": f"{split}-doc{d}", "summary": {"text": summary}},
                "question": {"text": f"Where does {split}hero{d} go in chapter {q} ?"},
                "answers": [{"text": f"To town{q} ."}, {"text": f"town{q}"}],
            })
    return rows


def gsm8k_rows(split: str, n: int) -> list[dict]:
    rows = []
    for i in range(n):
        total = 1000 + 117 * i
        rows.append({
            "question": f"{split} problem {i}: Sam has {total - 7} apples and buys 7 more. How many now?",
            "answer": f"Sam has {total - 7} + 7 = <<{total - 7}+7={total}>>{total} apples.\n#### {total:,}",
        })
    return rows


MIRROR = {
    ("cnn_dailymail", "test"): lambda: cnndm_rows("test", 12),
    ("cnn_dailymail", "validation"): lambda: cnndm_rows("validation", 4),
    ("narrativeqa", "test"): lambda: narrativeqa_rows("test", 6),
    ("narrativeqa", "validation"): lambda: narrativeqa_rows("validation", 8),
    ("gsm8k", "test"): lambda: gsm8k_rows("test", 12),
    ("gsm8k", "train"): lambda: gsm8k_rows("train", 20),
}


def write_jsonl(path, rows, gz: bool):
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if gz:
        with gzip.open(path.with_name(path.name + ".gz"), "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")


def write_mirror(root, gz: bool = True):
    """A complete tiny mirror in the interface.md layout (also usable by other test modules)."""
    for (folder, split), rows in MIRROR.items():
        write_jsonl(root / folder / f"{split}.jsonl", rows(), gz)
    return root


@pytest.fixture(params=[True, False], ids=["gzip", "plain"])
def mirror(request, tmp_path):
    return str(write_mirror(tmp_path, gz=request.param))


@pytest.fixture(scope="module")
def tok():
    from kvbench.models.tiny import byte_tokenizer

    return byte_tokenizer()  # one token per byte, ChatML chat template


def encoded_len(task, tok, prompt):
    return len(task.encode(tok, prompt))


# ----------------------------------------------------------------------------- reading rows
def test_gzip_and_plain_mirrors_read_the_same_rows(tmp_path):
    a, b = write_mirror(tmp_path / "a", gz=True), write_mirror(tmp_path / "b", gz=False)
    assert (a / "gsm8k" / "test.jsonl.gz").exists() and (b / "gsm8k" / "test.jsonl").exists()
    for cls in (CNNDM, NarrativeQA, GSM8K):
        rows_a = data.load(cls.dataset, "test", str(a))
        assert rows_a == data.load(cls.dataset, "test", str(b))
        assert len(rows_a) == len(MIRROR[(cls.dataset.folder, "test")]())
    assert data.load(NarrativeQA.dataset, "test", str(a))[0] == narrativeqa_rows("test", 6)[0]
    # only the columns a task reads are kept
    assert data.load(CNNDM.dataset, "test", str(a))[0].keys() == {"article", "highlights"}


def test_hub_rows_are_flattened_to_the_task_columns(monkeypatch, tmp_path):
    import datasets

    full = narrativeqa_rows("test", 2)
    for r in full:  # the Hub also carries the whole book and token lists
        r["document"]["text"] = "A VERY LONG BOOK"
        r["document"]["summary"]["tokens"] = r["document"]["summary"]["text"].split()
    calls = []

    def fake_load(path, name=None, split=None):
        calls.append((path, name, split))
        return datasets.Dataset.from_list(full)

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    rows = data._read_hub.__wrapped__("deepmind/narrativeqa", None, "test", NarrativeQA.dataset.columns)
    assert calls == [("deepmind/narrativeqa", None, "test")]
    assert rows == narrativeqa_rows("test", 2)


def test_answers_in_either_hub_layout():
    assert answer_texts([{"text": "a", "tokens": ["a"]}, {"text": "b"}]) == ["a", "b"]
    assert answer_texts({"text": ["a", "b"], "tokens": [["a"], ["b"]]}) == ["a", "b"]


def test_missing_column_names_the_file(tmp_path):
    write_jsonl(tmp_path / "gsm8k" / "test.jsonl", [{"question": "q"}], gz=False)
    with pytest.raises(ConfigError, match=r"data.dir.*test.jsonl:1 has no column 'answer'"):
        data.load(GSM8K.dataset, "test", str(tmp_path))


# ----------------------------------------------------------------------------- bad configuration
def test_bad_inputs_fail_when_the_task_is_built(tmp_path):
    root = str(write_mirror(tmp_path))
    with pytest.raises(ConfigError, match=r"^task.n_samples=13: is larger than the test split \(12 rows\)"):
        GSM8K(n_samples=13, data_dir=root)
    with pytest.raises(ConfigError, match=r"^task.split=dev: openai/gsm8k has the splits train, test"):
        GSM8K(split="dev", data_dir=root)
    with pytest.raises(ConfigError, match=r"^task.shot_split=dev:"):
        NarrativeQA(shot_split="dev", data_dir=root)
    with pytest.raises(ConfigError, match=r"^data.dir=.*: has no cnn_dailymail/train.jsonl.gz or .jsonl"):
        CNNDM(split="train", data_dir=root)  # a Hub split the mirror lacks
    with pytest.raises(ConfigError, match=r"^task.n_shot=21: is larger than the train split"):
        GSM8K(n_shot=21, data_dir=root)
    with pytest.raises(ConfigError, match=r"^task.shots=some:"):
        GSM8K(shots="some", data_dir=root)
    GSM8K(n_samples=12, n_shot=20, data_dir=root)  # the limits themselves are fine


def test_hub_split_sizes_are_checked_without_downloading(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("rows were loaded")

    monkeypatch.setattr(data, "_read_hub", refuse)
    with pytest.raises(ConfigError, match=r"task.n_samples=1320: is larger than the test split \(1319 rows\)"):
        GSM8K(n_samples=1320)
    with pytest.raises(ConfigError, match=r"task.split=dev: deepmind/narrativeqa has the splits"):
        NarrativeQA(split="dev")
    CNNDM(n_samples=960)


def test_missing_rouge_is_an_error_never_a_zero(monkeypatch, tmp_path):
    root = str(write_mirror(tmp_path))
    answer_metrics.rouge_scorer.cache_clear()
    monkeypatch.setitem(sys.modules, "rouge_score", None)
    try:
        with pytest.raises(ConfigError, match=r"^task=cnndm: .*pip install rouge-score"):
            CNNDM(data_dir=root)
        with pytest.raises(ConfigError, match=r"^task=narrativeqa: "):
            NarrativeQA(data_dir=root)
        with pytest.raises(ImportError, match="rouge-score"):
            answer_metrics.rouge("a b", ["a b"])
        GSM8K(data_dir=root)  # does not need it
    finally:
        answer_metrics.rouge_scorer.cache_clear()


def test_making_the_rouge_scorer_logs_nothing_whatever_logging_is_set_up(caplog):
    """rouge-score logs "Using default tokenizer." at INFO through absl: after a caller (pytest, a sweep, absl itself)
    set logging up at INFO, it would reach a command's stderr beside a one-line refusal."""
    import logging

    answer_metrics.rouge_scorer.cache_clear()
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.INFO)
    try:
        with caplog.at_level(logging.INFO):
            answer_metrics.rouge_scorer()
        assert not [r for r in caplog.records if r.name == "absl"], caplog.text
        assert absl.level == logging.INFO  # the caller's level is given back
    finally:
        absl.setLevel(level)
        answer_metrics.rouge_scorer.cache_clear()


def test_cli_rejects_too_many_samples_before_loading_a_model(tmp_path, monkeypatch, capsys):
    def refuse(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(kvrun.models, "load_model", refuse)
    root = write_mirror(tmp_path / "data")
    with pytest.raises(SystemExit) as exc:
        cli.main(["task=narrativeqa", "task.n_samples=13", f"data.dir={root}", f"results_dir={tmp_path}"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvbench: error: task.n_samples=13") and "\n" not in err


# ----------------------------------------------------------------------------- configs
@pytest.mark.parametrize("name,cls,n_shot,shot_split", [
    ("cnndm", CNNDM, 1, "validation"), ("narrativeqa", NarrativeQA, 2, "validation"), ("gsm8k", GSM8K, 16, "train"),
])
def test_task_configs(name, cls, n_shot, shot_split, tmp_path):
    root = write_mirror(tmp_path)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"task={name}", f"data.dir={root}", "task.n_samples=12"])
    prepare(cfg)
    task = build_task(cfg)
    assert type(task) is cls and task.name == name and task.data_dir == str(root)
    assert (task.n_shot, task.shot_split, task.split, task.max_input_tokens) == (n_shot, shot_split, "test", 3584)
    assert task.prompt_style == "chat" and task.shots == "fixed" and task.metric == ("accuracy" if name == "gsm8k" else "rouge2")
    assert set(cfg.task) >= {"n_samples", "seed", "n_shot", "max_input_tokens", "split", "prompt_style"}


# ----------------------------------------------------------------------------- sampling
def test_permutation_is_a_uniform_permutation():
    rng = random.Random(0)
    assert sorted(permutation(50, rng)) == list(range(50))
    firsts = [next(permutation(4, rng)) for _ in range(4000)]
    assert all(900 < firsts.count(k) < 1100 for k in range(4))


def _fisher_yates(n: int, seed: int) -> list[int]:
    """The samples' documented order (fewshot.py): a seeded Fisher-Yates shuffle of the split, here the dense
    textbook one (kvbench's is lazy and sparse)."""
    rng, a = random.Random(seed), list(range(n))
    for i in range(n):
        j = rng.randrange(i, n)
        a[i], a[j] = a[j], a[i]
    return a


def test_same_seed_same_rows_and_smaller_runs_are_prefixes(mirror, tok):
    def indices(**kw):
        return [s.index for s in GSM8K(data_dir=mirror, n_shot=1, **kw).samples(tok)]

    assert indices(n_samples=8, seed=3) == _fisher_yates(12, seed=3)[:8]  # the documented draw, written apart
    assert indices(n_samples=8, seed=3) != indices(n_samples=8, seed=4)
    assert indices(n_samples=4, seed=3) == indices(n_samples=8, seed=3)[:4]
    assert sorted(indices(n_samples=12)) == list(range(12))  # the whole split, each row once
    # the rows do not depend on how the prompt is built
    assert indices(n_samples=8, prompt_style="plain") == indices(n_samples=8)


def test_exemplars_are_seeded_and_shared(mirror, tok):
    def shots(**kw):
        return [s.meta["shots"] for s in GSM8K(data_dir=mirror, n_samples=5, n_shot=3, **kw).samples(tok)]

    a = shots(seed=1)
    assert a == shots(seed=1) and a != shots(seed=2)
    assert all(s == a[0] for s in a) and len(set(a[0])) == 3
    b = shots(seed=1, shots="per_sample")
    assert b == shots(seed=1, shots="per_sample") and len({tuple(s) for s in b}) > 1


@pytest.mark.parametrize("shots", ["fixed", "per_sample"])
def test_exemplars_disjoint_from_samples_in_the_same_split(mirror, tok, shots):
    task = GSM8K(data_dir=mirror, split="train", shot_split="train", n_samples=12, n_shot=4, shots=shots)
    samples = task.samples(tok)
    chosen = {s.index for s in samples}
    for s in samples:
        assert not set(s.meta["shots"]) & (chosen if shots == "fixed" else {s.index})
        assert len(set(s.meta["shots"])) == 4


@pytest.mark.parametrize("shots", ["fixed", "per_sample"])
def test_narrativeqa_exemplars_come_from_other_documents(mirror, tok, shots):
    task = NarrativeQA(data_dir=mirror, split="validation", n_samples=4, n_shot=2, shots=shots, max_input_tokens=None)
    rows = data.load(task.dataset, "validation", mirror)
    samples = task.samples(tok)
    doc = lambda i: rows[i]["document"]["id"]  # noqa: E731
    sample_docs = {doc(s.index) for s in samples}
    for s in samples:
        shot_docs = [doc(j) for j in s.meta["shots"]]
        assert len(set(shot_docs)) == 2  # two different documents
        assert doc(s.index) not in shot_docs
        if shots == "fixed":
            assert not set(shot_docs) & sample_docs


def test_too_few_exemplar_documents_is_an_error(mirror, tok):
    # every validation document has a sample: no exemplar may come from them
    task = NarrativeQA(data_dir=mirror, split="validation", n_samples=16, n_shot=1, max_input_tokens=None)
    with pytest.raises(ConfigError, match=r"task.n_shot=1: the validation split has only 0 usable exemplars"):
        task.samples(tok)


# ----------------------------------------------------------------------------- prompts
def test_chat_prompt_has_the_exemplar_and_the_template(mirror, tok):
    task = CNNDM(data_dir=mirror, n_samples=3, max_input_tokens=None)
    val = data.load(task.dataset, "validation", mirror)
    test = data.load(task.dataset, "test", mirror)
    for s in task.samples(tok):
        (shot,) = s.meta["shots"]
        assert s.prompt.startswith("<|im_start|>user\nArticle: " + val[shot]["article"] + "\n\nSummarise")
        assert f"<|im_start|>assistant\nSummary: {val[shot]['highlights']}<|im_end|>" in s.prompt
        assert s.prompt.endswith(
            f"Article: {test[s.index]['article']}\n\nSummarise the article above in three sentences."
            "<|im_end|>\n<|im_start|>assistant\nSummary:"
        )
        assert s.prompt.count("<|im_start|>user") == 2 and s.references == [test[s.index]["highlights"]]
        assert not s.truncated
        ids = task.encode(tok, s.prompt)
        assert 256 in ids and 257 in ids  # <|im_start|> and <|im_end|> are special tokens


def test_plain_prompt_for_base_models(mirror, tok):
    task = NarrativeQA(data_dir=mirror, n_samples=2, prompt_style="plain", max_input_tokens=None)
    val = data.load(task.dataset, "validation", mirror)
    for s in task.samples(tok):
        assert "<|im_start|>" not in s.prompt
        blocks = s.prompt.split("\n\nStory: ")
        assert len(blocks) == 3 and blocks[0].startswith("Story: ")
        for j, block in zip(s.meta["shots"], blocks[:2], strict=True):
            assert block.endswith(f"Question: {val[j]['question']['text']}\nAnswer: {val[j]['answers'][0]['text']}")
        assert s.prompt.endswith("?\nAnswer:")


def test_gsm8k_prompt(mirror, tok):
    task = GSM8K(data_dir=mirror, n_samples=2, n_shot=3, max_input_tokens=None)
    train = data.load(task.dataset, "train", mirror)
    s = task.samples(tok)[0]
    assert s.prompt.count("Solve each math problem step by step.") == 1
    assert s.prompt.startswith("<|im_start|>user\nSolve each math problem")
    assert s.prompt.count("<|im_start|>user\n") == 4 and s.prompt.count("\n#### ") == 3
    assert "<<" not in s.prompt  # calculator annotations removed
    j = s.meta["shots"][1]
    assert f"<|im_start|>user\nQuestion: {train[j]['question']}<|im_end|>" in s.prompt
    assert s.prompt.endswith("How many now?<|im_end|>\n<|im_start|>assistant\nAnswer:")
    assert s.references == [str(1000 + 117 * s.index)]  # "#### 1,468" -> "1468"


def test_document_is_cut_at_the_limit_and_counted(mirror, tok):
    full = {s.index: s for s in CNNDM(data_dir=mirror, n_samples=12, max_input_tokens=None).samples(tok)}
    task = CNNDM(data_dir=mirror, n_samples=12)
    lengths = sorted(encoded_len(task, tok, s.prompt) for s in full.values())
    limit = lengths[len(lengths) // 2]  # about half the prompts are over it
    task = CNNDM(data_dir=mirror, n_samples=12, max_input_tokens=limit)
    test = data.load(task.dataset, "test", mirror)
    samples = task.samples(tok)
    over = {i for i, s in full.items() if encoded_len(task, tok, s.prompt) > limit}
    assert 3 <= len(over) < 12
    assert {s.index for s in samples if s.truncated} == over
    for s in samples:
        n = encoded_len(task, tok, s.prompt)
        if not s.truncated:
            assert s.prompt == full[s.index].prompt and n <= limit
            continue
        assert n == limit  # a byte tokenizer can fill the limit exactly
        head, _, tail = s.prompt.rpartition("<|im_start|>user\nArticle: ")
        assert head == full[s.index].prompt.rpartition("<|im_start|>user\nArticle: ")[0]  # exemplar intact
        kept = tail.removesuffix(
            "\n\nSummarise the article above in three sentences.<|im_end|>\n<|im_start|>assistant\nSummary:"
        )
        article = test[s.index]["article"]
        assert kept != tail and article.startswith(kept) and len(kept) < len(article)


def test_summary_cut_keeps_the_question(mirror, tok):
    task = NarrativeQA(data_dir=mirror, n_samples=4, max_input_tokens=None)
    longest = max(encoded_len(task, tok, s.prompt) for s in task.samples(tok))
    task = NarrativeQA(data_dir=mirror, n_samples=4, max_input_tokens=longest - 40)
    samples = task.samples(tok)
    assert sum(s.truncated for s in samples) >= 1
    for s in samples:
        assert encoded_len(task, tok, s.prompt) <= longest - 40
        assert s.prompt.endswith(" ?<|im_end|>\n<|im_start|>assistant\nAnswer:")
        assert "Answer the question about the story in a few words.\nQuestion: Where does testhero" in s.prompt


def test_limit_below_the_fixed_part_is_an_error(mirror, tok):
    with pytest.raises(ConfigError, match=r"task.max_input_tokens=200: is too small: the prompt needs \d+ tokens"):
        CNNDM(data_dir=mirror, n_samples=1, max_input_tokens=200).samples(tok)
    with pytest.raises(ConfigError, match=r"task.max_input_tokens=300"):  # GSM8K has nothing to cut
        GSM8K(data_dir=mirror, n_samples=1, n_shot=2, max_input_tokens=300).samples(tok)


def test_chat_style_needs_a_chat_template(mirror, tok):
    from kvbench.models.tiny import byte_tokenizer

    bare = byte_tokenizer()
    bare.chat_template = None
    with pytest.raises(ConfigError, match="task.prompt_style=chat"):
        GSM8K(data_dir=mirror, n_samples=1, n_shot=1).samples(bare)
    assert GSM8K(data_dir=mirror, n_samples=1, n_shot=1, prompt_style="plain").samples(bare)


# ----------------------------------------------------------------------------- extraction
@pytest.mark.parametrize("text,number", [
    ("He pays 5 + 3 = 8 dollars.\n#### 1,234", "1234"),
    ("#### $1,234.50 in total", "1234.50"),
    ("So it costs $5.", "5"),
    ("The temperature drops to -3 degrees.", "-3"),
    ("It falls by -$12 overall.", "-12"),
    ("The difference is 10-3", "3"),
    ("The result is (4)-2", "2"),
    ("He walks 2.5 miles.", "2.5"),
    ("The answer is 18.", "18"),
    ("First 3 then 4, so #### 7\nand later 9", "7"),
    ("The answer is 42.\n#### unknown", "42"),
    ("I cannot tell.", ""),
    ("", ""),
])
def test_gsm8k_extraction(text, number):
    assert GSM8K().extract(text) == number


@pytest.mark.parametrize("answer,reference,hit", [
    ("1234", "1234", 1.0), ("18.00", "18", 1.0), ("-3", "-3", 1.0), ("3", "-3", 0.0), ("", "0", 0.0), ("17", "18", 0.0),
])
def test_gsm8k_score(answer, reference, hit):
    assert GSM8K().score(answer, [reference]) == {"accuracy": hit}


def test_stop_strings_cut_the_generation():
    assert GSM8K().cut_at_stop(" 2 + 2 = 4\n#### 4\n\nQuestion: next one") == "2 + 2 = 4\n#### 4\n\n"
    assert NarrativeQA().cut_at_stop("\n To town1 .\nQuestion: more") == "To town1 ."
    assert CNNDM().cut_at_stop(" One .\nTwo .\n\nArticle: (CNN) more") == "One .\nTwo .\n\n"


# ----------------------------------------------------------------------------- ROUGE
def test_rouge2_against_hand_computed_values():
    # bigrams: reference {the cat, cat sat, sat on, on the, the mat}, prediction shares 3 of its 5
    s = answer_metrics.rouge("the cat lay on the mat", ["the cat sat on the mat"])
    assert s["rouge2"] == pytest.approx(0.6)
    assert s["rouge1"] == pytest.approx(5 / 6)  # 5 of 6 unigrams in common
    assert s["rougeL"] == pytest.approx(5 / 6)  # LCS: the cat on the mat
    # precision 2/2, recall 2/3 -> F1 = 0.8
    assert answer_metrics.rouge("alpha beta gamma", ["alpha beta gamma delta"])["rouge2"] == pytest.approx(0.8)
    # stemming on: cats -> cat, running -> run; case and punctuation ignored
    assert answer_metrics.rouge("The cats running.", ["the cat run"])["rouge2"] == pytest.approx(1.0)
    assert answer_metrics.rouge("nothing shared here", ["the cat sat"]) == {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}


def test_rouge_takes_the_best_reference():
    refs = ["the cat sat on the mat", "the cat lay on the mat"]
    assert NarrativeQA().score("the cat lay on the mat", refs)["rouge2"] == pytest.approx(1.0)
    assert NarrativeQA().score("the cat lay on the mat", refs[:1])["rouge2"] == pytest.approx(0.6)


# ----------------------------------------------------------------------------- end to end
def run_cfg(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def assert_metrics_recomputable(record, task):
    rows = read_jsonl(record["predictions_path"])
    assert len(rows) == record["n_samples"]
    for row in rows:
        assert row["score"] == task.score(task.extract(row["prediction"]), row["references"])
    means = {k: sum(r["score"][k] for r in rows) / len(rows) for k in rows[0]["score"]}
    point = {k: v for k, v in record["metrics"].items() if not k.endswith("_ci")}  # the intervals: tests/core/test_stats.py
    assert point == pytest.approx(means) and task.metric in record["metrics"]


@pytest.mark.parametrize("name", ["cnndm", "narrativeqa", "gsm8k"])
def test_run_on_a_tiny_model_writes_recomputable_metrics(name, tmp_path):
    root = write_mirror(tmp_path / "data")
    cfg = run_cfg(f"task={name}", "model=tiny-llama", f"data.dir={root}", f"results_dir={tmp_path}",
                  "task.n_samples=3", "task.n_shot=1", "task.max_input_tokens=3000", "batch_size=2",
                  "gen.max_new_tokens=6", "gen.ignore_eos=true")
    record = kvrun.run(cfg)
    assert record["status"] == "ok", record["error"]
    assert read_records(tmp_path)[-1]["run_id"] == record["run_id"]
    assert record["prompts"]["n"] == 3 and record["prompts"]["tokens_max"] <= 3000
    assert_metrics_recomputable(record, build_task(cfg))


@pytest.mark.slow
@pytest.mark.parametrize("name,max_new", [("cnndm", 64), ("narrativeqa", 32), ("gsm8k", 160)])
def test_smollm2_on_the_shared_mirror(name, max_new, tmp_path):
    from pathlib import Path

    root = Path(__file__).resolve().parents[3] / "shared" / "data"
    if not root.is_dir():
        pytest.skip("no ../shared/data mirror")
    cfg = run_cfg("model=smollm2-135m", f"task={name}", "task.n_samples=4", f"data.dir={root}",
                  f"results_dir={tmp_path}", f"gen.max_new_tokens={max_new}", "batch_size=4")
    record = kvrun.run(cfg)
    assert record["status"] == "ok", record["error"]
    assert_metrics_recomputable(record, build_task(cfg))


# ----------------------------------------------------------------- issue 13: bad data found before the model
def _damage(root, how):
    """Damage gsm8k/test (or train, the exemplars) in `root`; returns (file, line) the message must name."""
    test, train = root / "gsm8k" / "test.jsonl.gz", root / "gsm8k" / "train.jsonl.gz"
    rows = [json.dumps(r).encode() for r in gsm8k_rows("test", 12)]
    if how == "truncated_gzip":
        blob = gzip.compress(b"\n".join(rows) + b"\n")
        test.write_bytes(blob[: len(blob) // 2])
        return test, None
    if how == "exemplar_missing_column":
        shots = [json.dumps(r).encode() for r in gsm8k_rows("train", 20)]
        shots[6] = json.dumps({"question": "no answer here"}).encode()
        train.write_bytes(gzip.compress(b"\n".join(shots) + b"\n"))
        return train, 7
    rows[4] = {"missing_column": json.dumps({"question": "q?"}).encode(), "invalid_json": b'{"question": "q?", ',
               "not_utf8": b'{"question": "caf\xe9", "answer": "#### 1"}', "not_an_object": b'["q", "a"]'}[how]
    test.write_bytes(gzip.compress(b"\n".join(rows) + b"\n"))
    return test, 5


@pytest.mark.parametrize("how,problem", [
    ("missing_column", "has no column 'answer'"), ("invalid_json", "invalid JSON"), ("not_utf8", "not UTF-8"),
    ("not_an_object", "not a JSON object"), ("truncated_gzip", "damaged or cut short"),
    ("exemplar_missing_column", "has no column 'answer'"),
])
def test_bad_data_is_one_line_naming_file_and_line_before_any_model(how, problem, tmp_path, monkeypatch, capsys):
    """Case 8: every row the run reads is parsed in the preflight: exit 2, one line, nothing written."""
    def refuse(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(kvrun.models, "load_model", refuse)
    root = write_mirror(tmp_path / "data")
    path, line = _damage(root, how)
    data._read_mirror.cache_clear()
    data._count_lines.cache_clear()
    with pytest.raises(SystemExit) as exc:
        cli.main(["task=gsm8k", "task.n_samples=12", "task.n_shot=3", "model=tiny-llama", f"data.dir={root}",
                  f"results_dir={tmp_path / 'results'}"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and "\n" not in err and "Traceback" not in err, err
    assert err.startswith("kvbench: error: data.dir: ") and f"{path}:" in err and problem in err, err
    if line is not None:
        assert f"{path}:{line}" in err
    assert not (tmp_path / "results").exists()  # nothing written

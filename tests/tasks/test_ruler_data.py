"""What RULER's tasks read (kvbench/tasks/ruler_data.py, ruler_kvpress.py, ruler_words/): the essay haystack,
the QA corpora, kvpress's leaderboard rows and the word pools, on tiny data sets in the Hub's layout written
here (tests.tasks.ruler_shards); the Hub is never reached (HF_HUB_OFFLINE: reading it is refused in one line).
"""

from __future__ import annotations

import random

import pytest

from kvbench.errors import ConfigError
from kvbench.models.tiny import byte_tokenizer
from kvbench.tasks import TASKS
from kvbench.tasks import ruler_data as rd
from kvbench.tasks import ruler_text as rt
from kvbench.tasks.ruler_kvpress import render
from tests.tasks import ruler_shards

TOK = byte_tokenizer()
ESSAY_TASKS = ("niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multivalue", "niah_multiquery")


# ---------------------------------------------------------------------- the essay haystack
@pytest.mark.parametrize("name", ESSAY_TASKS)
def test_essay_tasks_read_paul_grahams_essays(name, shards):
    task = TASKS[name](n_samples=2, context_length=1500, data_dir=shards)
    assert task.hay == "essay"
    (s, _) = task.samples(TOK)
    assert "Sentence 0 of essay 0 is about startups." in s.prompt  # the mirror's text, in order
    assert not any(e.startswith("task: haystack") or "CNN" in e for e in task.describe()["extensions"])


def test_the_essay_haystack_is_never_silently_noise(tmp_path):
    task = TASKS["niah_single_2"](n_samples=1, context_length=600)  # no data.dir: the Hub, offline in tests
    with pytest.raises(ConfigError, match=r"task.haystack=essay: Paul Graham's essays \(baber/paul_graham_essays\) "
                       r"could not be read from the Hugging Face Hub .* or task.haystack=noise$"):
        task.samples(TOK)
    asked = TASKS["niah_single_2"](n_samples=1, context_length=600, haystack="noise")  # noise when asked
    assert "The grass is green." in asked.samples(TOK)[0].prompt
    assert "task: haystack noise (task.haystack; RULER's niah_single_2: essay)" in asked.describe()["extensions"]


def test_the_cnndm_haystack_is_an_explicit_departure(tmp_path):
    ruler_shards.write(tmp_path, "cnn_dailymail", "test", [{"article": "A storm hit the coast. Homes were lost.",
                                                            "highlights": "h"}] * 3)
    task = TASKS["niah_single_3"](n_samples=1, context_length=700, haystack="cnndm", data_dir=str(tmp_path))
    assert "A storm hit the coast." in task.samples(TOK)[0].prompt
    assert any("CNN/DailyMail" in e for e in task.describe()["extensions"])


# ---------------------------------------------------------------------- qa_1 and qa_2
def test_squad_is_read_as_rulers_read_squad(shards):
    qas, docs = rd.qa_corpus("squad", shards)
    assert docs == sorted(docs) and len(docs) == 12  # distinct paragraphs, sorted
    assert len(qas) == 12  # the unanswerable questions dropped, the others in order
    first = qas[0]
    assert first["query"] == "Who keeps gate 0-0?" and first["outputs"] == ["Keeper00", "keeper00"]
    assert docs[first["context"][0]].startswith("Paragraph 0 of article 0.")
    assert sorted(docs[i][:12] for i in first["more_context"]) == ["Paragraph 1 ", "Paragraph 2 ", "Paragraph 3 "]
    assert all("article 0." in docs[i] for i in first["more_context"])  # the same article's other paragraphs


def test_hotpotqa_is_read_as_rulers_read_hotpotqa(shards):
    qas, docs = rd.qa_corpus("hotpotqa", shards)
    assert len(qas) == 12 and len(docs) == 120
    assert qas[2]["outputs"] == ["R23"] and len(qas[2]["context"]) == 10
    assert docs[qas[2]["context"][3]] == "Place 2-3\nPlace 2-3 lies by river R23. It has 5 bridges."  # title\\nsentences


@pytest.mark.parametrize("name,length", [("qa_1", 700), ("qa_2", 2500)])
def test_qa_prompt_holds_the_gold_documents_among_others(name, length, shards):
    task = TASKS[name](n_samples=3, context_length=length, data_dir=shards)
    qas, docs = rd.qa_corpus(task.args["dataset"], shards)
    for i, s in enumerate(task.samples(TOK)):
        context = s.prompt[: s.question_at]
        assert all(docs[d] in context for d in qas[i]["context"])
        assert context.count("Document ") == s.meta["units"] > len(qas[i]["context"])
        assert s.prompt[s.question_at:].lstrip().startswith("Answer the question based on the given documents.")
        assert f"Question: {qas[i]['query']}" in s.prompt and s.references == qas[i]["outputs"]
    assert task.gen_tokens == 32 and task.metric == "string_match_part"
    with pytest.raises(ConfigError, match="task.n_samples=13: qa_.* has 12 questions"):
        TASKS[name](n_samples=13, context_length=length, data_dir=shards).samples(TOK)


def test_qa_without_its_data_set_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="data.dir=.*: has no squad_v2/validation.jsonl.gz .*, which task=qa_1 reads"):
        TASKS["qa_1"](data_dir=str(tmp_path))
    with pytest.raises(ConfigError, match=r"task=qa_2: HotpotQA \(hotpotqa/hotpot_qa\) could not be read"):
        TASKS["qa_2"](n_samples=1, context_length=900).samples(TOK)


# ---------------------------------------------------------------------- task.source=kvpress
@pytest.mark.parametrize("style", ["chat", "plain"])
def test_kvpress_rows_are_rendered_as_kvpress_pipeline_does(style, shards):
    task = TASKS["niah_single_1"](n_samples=3, context_length=4096, source="kvpress", prompt_style=style,
                                  data_dir=shards)
    rows = rd.kvpress_rows("niah_single_1", 4096, shards)
    samples = task.samples(TOK)
    assert len(rows) == 3 and [s.references for s in samples] == [r["answer"] for r in rows]
    for s, r in zip(samples, rows, strict=True):
        if style == "chat":  # kvpress: chat template of context + separator, the question put where it was
            sep = "#" * (len(r["context"]) + 10)
            text = TOK.apply_chat_template([{"role": "user", "content": r["context"] + sep}], tokenize=False,
                                           add_generation_prompt=True)
            want = text.replace(sep, r["question"]) + r["answer_prefix"]
        else:  # kvpress without a chat template: BOS + context, then question + "\\n" + answer prefix
            want = r["context"] + r["question"] + "\n" + r["answer_prefix"]
        assert s.prompt == want
        assert s.prompt[s.question_at:].startswith(r["question"])
    assert any("simonjegou/ruler" in e for e in task.describe()["extensions"])


def test_kvpress_source_refusals(shards, tmp_path):
    with pytest.raises(ConfigError, match="task.context_length=2048: task.source=kvpress has the lengths 4096, 8192, 16384"):
        TASKS["vt"](source="kvpress", context_length=2048)
    with pytest.raises(ConfigError, match="task.haystack=noise: task.source=kvpress reads fixed prompts"):
        TASKS["niah_single_1"](source="kvpress", haystack="noise")
    with pytest.raises(ConfigError, match="data.dir=.*: has no ruler_kvpress/4096/test.jsonl.gz .*, which task.source=kvpress reads"):
        TASKS["vt"](source="kvpress", data_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="task.n_samples=4: kvpress's cwe at 4096 tokens has 3 rows"):
        TASKS["cwe"](source="kvpress", n_samples=4, data_dir=shards).check_data()
    with pytest.raises(ConfigError, match="task.source=ruler: must be one of kvbench, kvpress"):
        TASKS["vt"](source="ruler")
    assert render(TASKS["qa_2"](source="kvpress", prompt_style="plain"), TOK, "c ", "q? ", "Answer:") == ("c q? \nAnswer:", 2)


# ---------------------------------------------------------------------- RULER's word pools
def test_word_pools_are_rulers_wonderwords_lists():
    adjs, nouns = rt.key_words()
    assert rt.n_key_pairs() == len(adjs) * len(nouns) == 6_171_620  # RULER's sorted(set(adj-noun pairs))
    assert len(rt.cwe_words(8166)) == 8166  # RULER's sorted(set(nouns + adjs + verbs))
    big = rt.cwe_words(20_000)
    assert len(big) == len(set(big)) >= 20_000 and all(" " not in w and "-" not in w for w in big[8166:])
    rng = random.Random(0)
    keys = {rt.word_key(rng) for _ in range(2000)}
    a, n = set(adjs), set(nouns)  # each key an adjective, "-", a noun (either may hold a hyphen itself)
    assert len(keys) >= 1999 and all(any(k[:i] in a and k[i + 1:] in n for i, c in enumerate(k) if c == "-")
                                     for k in keys)


def test_multikey_2_distractors_rarely_carry_the_asked_key():
    """RULER's niah_multikey_2 at 128k holds ~6,000 distractor needles (about 21 tokens each), so a distractor
    with the asked key comes with probability 1 - (1 - 1/pairs)^6000: 0.1% with RULER's 6.2M pairs (kvbench's
    old 34,839 pairs: 16%). Measured on draws of the task's own key generator."""
    distractors, trials = 6000, 400
    rng = random.Random(1)
    hits = 0
    for _ in range(trials):
        asked = rt.needle_value(rng, "words")
        hits += any(rt.needle_value(rng, "words") == asked for _ in range(distractors))
    expected = 1 - (1 - 1 / rt.n_key_pairs()) ** distractors
    assert expected <= 0.001 and hits / trials <= 0.01  # RULER's rate; 34,839 pairs would give ~64 of 400

"""The data RULER's tasks read: the essay haystack, the QA corpora, and kvpress's leaderboard rows.

Each comes from the Hugging Face Hub or from the local mirror (`data.dir`, in the Hub's columns:
docs/contract.md), through kvbench.tasks.data:
- the essay haystack: Paul Graham's essays, `baber/paul_graham_essays` (the Hub data set lm-evaluation-harness's
  RULER reads; RULER downloads the same essays from its URL list), one essay a row in `text`; joined with spaces
  and whitespace collapsed (lm-eval's get_haystack). `task.haystack=cnndm` reads CNN/DailyMail test articles
  instead, an explicit departure;
- qa_1: SQuAD v2's dev set (`rajpurkar/squad_v2`, validation), qa_2: HotpotQA's distractor dev set
  (`hotpotqa/hotpot_qa` distractor, validation), read into RULER's (questions, documents) exactly as RULER's
  qa.py reads its JSON files (`read_squad`, `read_hotpotqa`);
- `task.source=kvpress`: the rows of kvpress's leaderboard data set `simonjegou/ruler` (config = the context
  length: 4096, 8192 or 16384; split test), columns context, question, answer_prefix, answer, task,
  max_new_tokens (kvpress's evaluation/benchmarks/ruler/create_huggingface_dataset.py).
Without a mirror the Hub is read; a Hub that cannot be reached is one ConfigError naming what is missing.
"""

from __future__ import annotations

import functools

from kvbench.errors import ConfigError
from kvbench.tasks import data
from kvbench.tasks import ruler_text as rt
from kvbench.tasks.data import ANY, TEXT, Kind, Source

ESSAYS = Source(hub="baber/paul_graham_essays", config=None, folder="paul_graham_essays", sizes=(),  # read whole
                columns=("text",))
SQUAD = Source(hub="rajpurkar/squad_v2", config=None, folder="squad_v2", sizes=(("validation", 11873),),
               columns=("title", "context", "question", "answers.text"), kinds=(TEXT, TEXT, TEXT, ANY))
HOTPOT = Source(hub="hotpotqa/hotpot_qa", config="distractor", folder="hotpot_qa",
                sizes=(("validation", 7405),), columns=("question", "answer", "context.title", "context.sentences"),
                kinds=(TEXT, TEXT, ANY, ANY))
KVPRESS_LENGTHS = (4096, 8192, 16384)  # kvpress's generate.sh SEQ_LENGTHS
LIST = Kind("a list of text", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v))
INT = Kind("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool))


def kvpress_source(context_length: int) -> Source:
    return Source(hub="simonjegou/ruler", config=str(context_length), folder=f"ruler_kvpress/{context_length}",
                  sizes=(("test", 13 * 500),),  # kvpress's generate.sh: 13 tasks, 500 samples each
                  columns=("context", "question", "answer_prefix", "answer", "task", "max_new_tokens"),
                  kinds=(TEXT, TEXT, TEXT, LIST, TEXT, INT))


def mirrors(task) -> list[tuple[Source, str, str, str, str]]:
    """(source, split, config key, its value, what the data is) of the data a generated RULER task reads."""
    if task.kind == "qa":
        squad = task.args["dataset"] == "squad"
        return [(SQUAD, "validation", "task", task.name, "SQuAD v2") if squad else
                (HOTPOT, "validation", "task", task.name, "HotpotQA")]
    if task.hay == "essay":
        return [(ESSAYS, "train", "task.haystack", "essay", "Paul Graham's essays")]
    if task.hay == "cnndm":
        from kvbench.tasks.cnndm import CNNDM

        return [(CNNDM.dataset, "test", "task.haystack", "cnndm", "CNN/DailyMail")]
    return []


def has_mirror(source: Source, split: str, data_dir: str | None) -> bool:
    try:
        data.mirror_file(source, split, data_dir)
    except ConfigError:
        return False
    return bool(data_dir)


def rows(source: Source, split: str, data_dir: str | None, key: str, value: str, what: str) -> list[dict]:
    """The split's rows; ConfigError when data.dir lacks it, or the Hub cannot give it (naming `key`=`value`,
    the setting that reads it), before any model loads."""
    alt = ", or task.haystack=noise" if value == "essay" else ""
    if data_dir and not has_mirror(source, split, data_dir):
        raise ConfigError("data.dir", f"has no {source.folder}/{split}.jsonl.gz (or .jsonl), which {key}={value} "
                          f"reads ({what}: the Hub's {source.hub}, its columns){alt}", data_dir)
    try:
        return data.load(source, split, data_dir)
    except ConfigError:
        raise
    except Exception as e:  # the Hub unreachable, the data set missing: one line, before any model
        first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
        raise ConfigError(key, f"{what} ({source.hub}) could not be read from the Hugging Face Hub ({first}): "
                          f"give data.dir with {source.folder}/{split}.jsonl.gz{alt}", value) from None


@functools.lru_cache(maxsize=4)
def haystack_words(kind: str, data_dir: str | None) -> list[str]:
    """The essay haystack's words (`essay`: Paul Graham's essays; `cnndm`: CNN/DM's test articles)."""
    if kind == "essay":
        texts = [r["text"] for r in rows(ESSAYS, "train", data_dir, "task.haystack", "essay", "Paul Graham's essays")]
    else:
        from kvbench.tasks.cnndm import CNNDM

        texts = [r["article"] for r in rows(CNNDM.dataset, "test", data_dir, "task.haystack", "cnndm", "CNN/DailyMail")]
    return rt.essay_words(texts)


@functools.lru_cache(maxsize=2)
def qa_corpus(dataset: str, data_dir: str | None) -> tuple[list[dict], list[str]]:
    """(questions, documents) as RULER's read_squad / read_hotpotqa build them: documents distinct and sorted,
    each question with its gold documents' indices (`context`), SQuAD's also with its article's other
    paragraphs (`more_context`); SQuAD's unanswerable questions dropped."""
    if dataset == "squad":
        got = rows(SQUAD, "validation", data_dir, "task", "qa_1", "SQuAD v2")
        docs = sorted({r["context"] for r in got})
        index = {c: i for i, c in enumerate(docs)}
        by_title: dict[str, list[int]] = {}
        for r in got:  # an article's paragraphs, in order (RULER: more_docs of d['paragraphs'])
            ids = by_title.setdefault(r["title"], [])
            if index[r["context"]] not in ids:
                ids.append(index[r["context"]])
        qas = [{"query": r["question"], "outputs": list(r["answers"]["text"]), "context": [index[r["context"]]],
                "more_context": [i for i in by_title[r["title"]] if i != index[r["context"]]]}
               for r in got if r["answers"]["text"]]  # RULER: not is_impossible
        return qas, docs
    got = rows(HOTPOT, "validation", data_dir, "task", "qa_2", "HotpotQA")

    def paragraphs(r):
        return [f"{t}\n{''.join(p)}" for t, p in zip(r["context"]["title"], r["context"]["sentences"], strict=True)]

    docs = sorted({d for r in got for d in paragraphs(r)})
    index = {c: i for i, c in enumerate(docs)}
    return [{"query": r["question"], "outputs": [r["answer"]], "context": [index[d] for d in paragraphs(r)]}
            for r in got], docs


def kvpress_rows(task: str, context_length: int, data_dir: str | None) -> list[dict]:
    """kvpress's leaderboard rows of one RULER task at one context length, in the data set's order."""
    got = rows(kvpress_source(context_length), "test", data_dir, "task.source", "kvpress", "kvpress's RULER rows")
    return [r for r in got if r["task"] == task]

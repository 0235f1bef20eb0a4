"""Tiny data sets in the Hub's layout for RULER's tasks, written into a `data.dir` (nothing is downloaded).

The folders and columns are those kvbench.tasks.ruler_data reads (docs/contract.md): Paul Graham's essays
(`baber/paul_graham_essays`: text), SQuAD v2 (`rajpurkar/squad_v2`: title, context, question, answers.text;
one row a question, unanswerable ones with no answer), HotpotQA (`hotpotqa/hotpot_qa` distractor: question,
answer, context.title, context.sentences) and kvpress's RULER rows (`simonjegou/ruler`: context, question,
answer_prefix, answer, task, max_new_tokens). The text is made up, in sentences, so the essay haystack splits.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

TOPICS = ["startups", "cities", "painting", "programming languages", "essays", "wealth", "schools", "founders"]


def write(root: Path, folder: str, split: str, rows: list[dict], gz: bool = True) -> Path:
    path = root / folder / (f"{split}.jsonl.gz" if gz else f"{split}.jsonl")
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def essays(n: int = 5) -> list[dict]:
    return [{"text": f"Essay {i} on {TOPICS[i % len(TOPICS)]}\n\n" + "\n".join(
        f"Sentence {j} of essay {i} is about {TOPICS[(i + j) % len(TOPICS)]}. It asks why, and answers it!"
        for j in range(40))} for i in range(n)]


def squad(articles: int = 3, paragraphs: int = 4) -> list[dict]:
    rows = []
    for a in range(articles):
        for p in range(paragraphs):
            context = f"Paragraph {p} of article {a}. The keeper of gate {a}-{p} is named Keeper{a}{p}."
            rows.append({"title": f"Article_{a}", "context": context, "question": f"Who keeps gate {a}-{p}?",
                         "answers": {"text": [f"Keeper{a}{p}", f"keeper{a}{p}"], "answer_start": [40, 40]}})
            rows.append({"title": f"Article_{a}", "context": context, "question": f"Who painted gate {a}-{p}?",
                         "answers": {"text": [], "answer_start": []}})  # unanswerable: RULER drops it
    return rows


def hotpot(n: int = 12) -> list[dict]:
    rows = []
    for q in range(n):
        titles = [f"Place {q}-{k}" for k in range(10)]
        sentences = [[f"Place {q}-{k} lies by river R{q}{k}.", f" It has {k + 2} bridges."] for k in range(10)]
        rows.append({"question": f"Which river runs by place {q}-3?", "answer": f"R{q}3",
                     "context": {"title": titles, "sentences": sentences}})
    return rows


KVPRESS_PREFIX = {"niah": "The special magic numbers for {q} mentioned in the provided text are", "vt": "Answer: ",
                  "cwe": "Answer: The top 10 words that appear most often in the list are:",
                  "fwe": "Answer: According to the coded text above, the three most frequently appeared words are:",
                  "qa": "Answer:"}
KVPRESS_TOKENS = {"niah": 128, "vt": 30, "cwe": 120, "fwe": 50, "qa": 32}


def kvpress_rows(tasks: list[str], per_task: int = 3) -> list[dict]:
    rows = []
    for task in tasks:
        kind = task.split("_")[0]
        for i in range(per_task):
            rows.append({"context": f"Some text for {task} row {i}.\n" + "The grass is green. " * 20,
                         "question": f"What is the value for {task} {i}? ",
                         "answer_prefix": KVPRESS_PREFIX[kind].format(q=f"{task}-{i}"),
                         "answer": [f"{1000000 + i}"], "task": task, "max_new_tokens": KVPRESS_TOKENS[kind]})
    return rows


def mirror(root: Path, kvpress_tasks: list[str] | None = None) -> str:
    """`root` as a data.dir holding every RULER data set above; returns it as a string."""
    write(root, "paul_graham_essays", "train", essays())
    write(root, "squad_v2", "validation", squad())
    write(root, "hotpot_qa", "validation", hotpot(), gz=False)
    if kvpress_tasks:
        write(root, "ruler_kvpress/4096", "test", kvpress_rows(kvpress_tasks))
    return str(root)

"""NarrativeQA, summaries setting (the paper: 2-shot, ROUGE-2, best over the two answers).

Prompt: "Story: <Wikipedia summary>\n\nAnswer the question about the story in a few words.
\nQuestion: ..." answered by "Answer: ...". Exemplars come from the validation split, each from a
different document and never from a sample's document; an exemplar's answer is its first one.
The target summary is the part cut to fit (the paper's prompts all fit in 3584 tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from kvbench.tasks import answer_metrics
from kvbench.tasks.data import TEXT, Kind, Source
from kvbench.tasks.fewshot import FewShotTask

INSTRUCTION = "Answer the question about the story in a few words."


def answer_texts(answers) -> list[str]:
    """The answers' texts, from a list of {"text": ...} or a {"text": [...]} column."""
    return list(answers["text"]) if isinstance(answers, dict) else [a["text"] for a in answers]


def _answers_ok(v) -> bool:
    texts = v.get("text") if isinstance(v, dict) else v
    if not isinstance(texts, list) or not texts:
        return False
    return all(isinstance(a, str) if isinstance(v, dict) else isinstance(a, dict) and isinstance(a.get("text"), str)
               for a in texts)


ANSWERS = Kind('a non-empty list of {"text": ...} answers', _answers_ok)


@dataclass
class NarrativeQA(FewShotTask):
    n_shot: int = 2
    max_input_tokens: int | None = 3584
    split: str = "test"
    shot_split: str = "validation"

    name: ClassVar[str] = "narrativeqa"
    metric: ClassVar[str] = "rouge2"
    stop_strings: ClassVar[tuple[str, ...]] = ("\n",)
    dataset: ClassVar[Source] = Source(
        hub="deepmind/narrativeqa",
        config=None,
        folder="narrativeqa",
        sizes=(("train", 32747), ("validation", 3461), ("test", 10557)),
        columns=("document.id", "document.summary.text", "question.text", "answers"),
        kinds=(Kind("an id (text or number)", lambda v: isinstance(v, (str, int)) and not isinstance(v, bool)),
               TEXT, TEXT, ANSWERS),
    )

    def document(self, row: dict) -> str:
        return row["document"]["summary"]["text"]

    def user(self, row: dict, document: str) -> str:
        return f"Story: {document}\n\n{INSTRUCTION}\nQuestion: {row['question']['text']}"

    def answer(self, row: dict) -> str:
        return answer_texts(row["answers"])[0]

    def references(self, row: dict) -> list[str]:
        return answer_texts(row["answers"])

    def key(self, row: dict, split: str, index: int):
        return row["document"]["id"]

    def score(self, answer: str, references: list[str]) -> dict[str, float]:
        return answer_metrics.rouge(answer, references)

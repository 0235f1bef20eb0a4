"""CNN/DailyMail 3.0.0 summarisation (the paper: 1-shot, ROUGE-2, input cut to 3584 tokens).

Prompt (HELM-style, the instruction after the article): "Article: ...\n\nSummarise the article
above in three sentences." answered by "Summary: <highlights>". The exemplar comes from the
validation split; the target article is the part cut to fit. Reference: the highlights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from kvbench.tasks import answer_metrics
from kvbench.tasks.data import Source
from kvbench.tasks.fewshot import FewShotTask

INSTRUCTION = "Summarise the article above in three sentences."


@dataclass
class CNNDM(FewShotTask):
    n_shot: int = 1
    max_input_tokens: int | None = 3584
    split: str = "test"
    shot_split: str = "validation"

    name: ClassVar[str] = "cnndm"
    metric: ClassVar[str] = "rouge2"
    stop_strings: ClassVar[tuple[str, ...]] = ("Article:",)
    answer_prefix: ClassVar[str] = "Summary:"
    dataset: ClassVar[Source] = Source(
        hub="abisee/cnn_dailymail",
        config="3.0.0",
        folder="cnn_dailymail",
        sizes=(("train", 287113), ("validation", 13368), ("test", 11490)),
        columns=("article", "highlights"),
    )

    def document(self, row: dict) -> str:
        return row["article"]

    def user(self, row: dict, document: str) -> str:
        return f"Article: {document}\n\n{INSTRUCTION}"

    def answer(self, row: dict) -> str:
        return row["highlights"]

    def references(self, row: dict) -> list[str]:
        return [row["highlights"]]

    def score(self, answer: str, references: list[str]) -> dict[str, float]:
        return answer_metrics.rouge(answer, references)

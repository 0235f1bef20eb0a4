"""GSM8K grade-school maths (the paper: 16-shot, accuracy of the final number).

Prompt: the instruction once, then "Question: ..." turns answered by "Answer: <reasoning>\n#### N",
the train answers with their calculator annotations ("<<48/2=24>>") removed. Extraction: the
number on the "####" line if there is one, else the last number of the generation, without "$"
and thousands commas; scoring: numeric equality with the reference after "####".
Nothing is cut: a prompt longer than `max_input_tokens` is an error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from kvbench.tasks import answer_metrics
from kvbench.tasks.data import Source
from kvbench.tasks.fewshot import FewShotTask

INSTRUCTION = (
    "Solve each math problem step by step. "
    "Finish with a line '#### N' where N is the final answer, a number only.\n\n"
)
CALCULATOR = re.compile(r"<<[^>]*>>")
NUMBER = re.compile(r"(?:(?<![\w)])-)?\$?\d[\d,]*(?:\.\d+)?")  # "5-3" is no negative number
FINAL = re.compile(r"####([^\n]*)")


def plain_number(text: str) -> str:
    return text.replace("$", "").replace(",", "")


@dataclass
class GSM8K(FewShotTask):
    n_shot: int = 16
    max_input_tokens: int | None = 3584
    split: str = "test"
    shot_split: str = "train"

    name: ClassVar[str] = "gsm8k"
    metric: ClassVar[str] = "accuracy"
    stop_strings: ClassVar[tuple[str, ...]] = ("Question:",)
    preamble: ClassVar[str] = INSTRUCTION
    dataset: ClassVar[Source] = Source(
        hub="openai/gsm8k",
        config="main",
        folder="gsm8k",
        sizes=(("train", 7473), ("test", 1319)),
        columns=("question", "answer"),
    )

    def user(self, row: dict, document: str) -> str:
        return f"Question: {row['question']}"

    def answer(self, row: dict) -> str:
        return CALCULATOR.sub("", row["answer"])

    def references(self, row: dict) -> list[str]:
        return [plain_number(row["answer"].split("####")[-1].strip())]

    def extract(self, text: str) -> str:
        final = FINAL.search(text)
        numbers = NUMBER.findall(final.group(1))[:1] if final else []
        numbers = numbers or NUMBER.findall(text)[-1:]
        return plain_number(numbers[0]) if numbers else ""

    def score(self, answer: str, references: list[str]) -> dict[str, float]:
        return {"accuracy": float(any(answer_metrics.same_number(answer, r) for r in references))}

"""Synthetic passkey retrieval: a 5-digit number hidden at a chosen depth in filler text.

Made by kvbench (no data files), so the demo and the tests have a real long-range retrieval task:
a policy that evicts the passkey's pairs cannot answer. Score: exact match of the first number in
the generation. Sample i hides its key at depth `depth`, or, when depth is null, at depths spread
evenly over [0.1, 0.9] across the samples.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from kvbench.errors import ConfigError
from kvbench.tasks.task import Sample, Task

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
INSTRUCTION = (
    "There is a pass key hidden inside a lot of irrelevant text. Find it and remember it; "
    "I will ask you for it at the end.\n\n"
)
QUESTION = "\n\nWhat is the pass key? Answer with the number only."
NUMBER = re.compile(r"-?\d+")


@dataclass
class Passkey(Task):
    n_samples: int = 8
    split: str = "synthetic"
    context_tokens: int = 512  # filler length in tokens (approximately)
    depth: float | None = None

    name: ClassVar[str] = "passkey"
    metric: ClassVar[str] = "accuracy"
    stop_strings: ClassVar[tuple[str, ...]] = ("\n",)

    def validate(self) -> None:
        super().validate()
        if not isinstance(self.context_tokens, int) or self.context_tokens < 16:
            raise ConfigError("task.context_tokens", "must be an integer >= 16", self.context_tokens)
        if self.depth is not None and not (0.0 <= float(self.depth) <= 1.0):
            raise ConfigError("task.depth", "must be in [0, 1] or null", self.depth)

    def samples(self, tokenizer) -> list[Sample]:
        rng = self.rng()
        per_filler = max(1, len(tokenizer(FILLER, add_special_tokens=False)["input_ids"]))
        repeats = max(1, round(self.context_tokens / per_filler))
        out = []
        for i in range(self.n_samples):
            key = rng.randint(10000, 99999)
            depth = self.depth if self.depth is not None else 0.1 + 0.8 * (i / max(1, self.n_samples - 1))
            before = round(repeats * float(depth))
            needle = f"The pass key is {key}. Remember it. {key} is the pass key. "
            text = INSTRUCTION + FILLER * before + needle + FILLER * (repeats - before) + QUESTION
            prompt = self.render(tokenizer, [], text, answer_prefix="The pass key is")
            out.append(Sample(index=i, prompt=prompt, references=[str(key)], meta={"depth": depth},
                              question_at=prompt.rfind(QUESTION)))
        return out

    @property
    def splits_question(self) -> bool:
        return True

    def extract(self, text: str) -> str:
        m = NUMBER.search(text)
        return m.group(0) if m else ""

    def score(self, answer: str, references: list[str]) -> dict[str, float]:
        return {"accuracy": float(answer != "" and answer in references)}

"""Few-shot tasks over a dataset split: drawing the samples and the exemplars, building the prompts.

Samples: the first `n_samples` of a random permutation of the split (seeded by `task.seed`), so the
rows do not depend on the policy or the batch size, and a smaller run is a prefix of a larger one.
Exemplars: `n_shot` rows of `shot_split` from another seeded permutation, never the same source
(`key`: the row itself, or NarrativeQA's document) as a sample or as each other; the same for
every sample (`shots=fixed`) or drawn per sample (`shots=per_sample`).
Prompt: exemplars as earlier (user, assistant) turns, then the sample's user turn; the assistant
turns start with `answer_prefix`, which also ends the prompt. Only the sample's document is cut
to fit `max_input_tokens` (truncate.py).
A subclass says where its rows are (`dataset`) and how a row reads: `document`, `user`,
`answer`, `references`.
"""

from __future__ import annotations

import functools
import importlib.util
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

from kvbench.errors import ConfigError
from kvbench.tasks import answer_metrics, data, truncate
from kvbench.tasks.task import Sample, Task

SHOTS = ("fixed", "per_sample")


def permutation(n: int, rng: random.Random) -> Iterator[int]:
    """A uniform random permutation of range(n), produced lazily (sparse Fisher-Yates)."""
    moved: dict[int, int] = {}
    for i in range(n):
        j = rng.randrange(i, n)
        moved[i], moved[j] = moved.get(j, j), moved.get(i, i)
        yield moved.pop(i)


@dataclass
class FewShotTask(Task):
    shot_split: str = "validation"
    shots: str = "fixed"

    dataset: ClassVar[data.Source]
    answer_prefix: ClassVar[str] = "Answer:"
    preamble: ClassVar[str] = ""  # put before the first user turn only

    def validate(self) -> None:
        super().validate()
        if self.shots not in SHOTS:
            raise ConfigError("task.shots", f"must be one of {', '.join(SHOTS)}", self.shots)
        if not self.data_dir and importlib.util.find_spec("datasets") is None:
            raise ConfigError("data.dir", "is unset, so rows come from the Hub: install the datasets package")
        rows = data.n_rows(self.dataset, self.split, self.data_dir)
        if self.n_samples > rows:
            raise ConfigError(
                "task.n_samples", f"is larger than the {self.split} split ({rows} rows)", self.n_samples
            )
        shot_rows = data.n_rows(self.dataset, self.shot_split, self.data_dir, "task.shot_split") if self.n_shot else 0
        if self.n_shot > shot_rows:
            raise ConfigError("task.n_shot", f"is larger than the {self.shot_split} split", self.n_shot)
        if self.metric.startswith("rouge"):
            try:
                answer_metrics.rouge_scorer()
            except ImportError as e:
                raise ConfigError("task", str(e), self.name) from None

    # ------------------------------------------------------------ what a subclass defines
    def document(self, row: dict) -> str:
        """The part of the row that may be cut ("" if none)."""
        return ""

    def user(self, row: dict, document: str) -> str:
        raise NotImplementedError

    def answer(self, row: dict) -> str:
        """An exemplar's answer (after `answer_prefix`)."""
        raise NotImplementedError

    def references(self, row: dict) -> list[str]:
        raise NotImplementedError

    def key(self, row: dict, split: str, index: int):
        """Rows with equal keys never meet in one prompt."""
        return split, index

    # ------------------------------------------------------------ sampling and prompts
    def samples(self, tokenizer) -> list[Sample]:
        rows, pool, chosen = self.select()
        out = []
        for i, shots in chosen:
            prompt, cut = self.prompt(tokenizer, rows[i], [pool[j] for j in shots])
            out.append(Sample(i, prompt, self.references(rows[i]), cut, meta={"shots": shots}))
        return out

    def select(self) -> tuple[list[dict], list[dict], list[tuple[int, list[int]]]]:
        """(rows, exemplar pool, [(sample row, its exemplar rows)]): which rows the run reads."""
        rows = data.load(self.dataset, self.split, self.data_dir)
        if self.n_samples > len(rows):
            raise ConfigError(
                "task.n_samples", f"is larger than the {self.split} split ({len(rows)} rows)", self.n_samples
            )
        order = permutation(len(rows), self.rng())
        chosen = [next(order) for _ in range(self.n_samples)]
        pool = data.load(self.dataset, self.shot_split, self.data_dir) if self.n_shot else []
        if self.shots == "fixed":
            fixed = self.exemplars(pool, {self.key(rows[i], self.split, i) for i in chosen}, str(self.seed))
            return rows, pool, [(i, fixed) for i in chosen]
        return rows, pool, [
            (i, self.exemplars(pool, {self.key(rows[i], self.split, i)}, f"{self.seed}/{i}")) for i in chosen
        ]

    def check_data(self) -> None:
        """Preflight (no model): parse every row of the mirror's splits the run reads, check the task's
        columns and draw the samples and exemplars; a ConfigError names the file, line and problem."""
        if self.data_dir:
            self.select()

    def prompt(self, tokenizer, row: dict, shots: list[dict]) -> tuple[str, bool]:
        """(prompt, cut): `row` after the exemplar rows `shots`, its document cut to fit."""
        answers = [f"{self.answer_prefix} {self.answer(r)}" for r in shots]

        def build(document: str) -> str:
            users = [self.user(r, self.document(r)) for r in shots] + [self.user(row, document)]
            users[0] = self.preamble + users[0]
            return self.render(tokenizer, list(zip(users[:-1], answers, strict=True)), users[-1], self.answer_prefix)

        encode = functools.partial(self.encode, tokenizer)
        return truncate.fit(build, self.document(row), self.max_input_tokens, encode, tokenizer)

    def exemplars(self, pool: list[dict], taken: set, salt: str) -> list[int]:
        """`n_shot` rows of the pool, seeded by `salt`, whose keys are new and distinct."""
        picked, keys = [], set(taken)
        for j in permutation(len(pool), random.Random(f"shots/{salt}")):
            if len(picked) == self.n_shot:
                break
            k = self.key(pool[j], self.shot_split, j)
            if k not in keys:
                picked.append(j)
                keys.add(k)
        if len(picked) < self.n_shot:
            raise ConfigError(
                "task.n_shot", f"the {self.shot_split} split has only {len(picked)} usable exemplars", self.n_shot
            )
        return picked

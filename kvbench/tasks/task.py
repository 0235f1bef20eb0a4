"""The task interface: load rows, build prompts, extract the answer, score it.

A task is a small dataclass (its fields are the `task.*` config keys) with four jobs, kept apart
as in lm-evaluation-harness: `samples(tokenizer)` draws the rows and renders each prompt (the exact
text given to the tokenizer), `cut_at_stop(text)` cuts a generation at the task's stop strings,
`extract(text)` pulls the answer out of it, `score(answer, references)` computes the metric(s).
`aggregate` averages per-sample scores into the record's `metrics`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import ClassVar

from kvbench.errors import ConfigError

PROMPT_STYLES = ("chat", "plain")


@dataclass
class Sample:
    index: int  # row of the dataset split
    prompt: str  # exact text given to the tokenizer
    references: list[str]
    truncated: bool = False  # the document was shortened to fit max_input_tokens (records: prompts.n_cut)
    meta: dict = field(default_factory=dict)
    question_at: int | None = None  # where the question starts in `prompt` (tasks that can run query_aware=false)


@dataclass
class Task:
    n_samples: int = 8
    seed: int = 0
    n_shot: int = 0
    max_input_tokens: int | None = None
    split: str = "test"
    prompt_style: str = "chat"
    data_dir: str | None = None
    query_aware: bool = True  # false: the context is compressed before the question is prefilled (kvpress)

    name: ClassVar[str] = "base"
    metric: ClassVar[str] = "accuracy"  # the primary metric (the paper's column)
    stop_strings: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        if not isinstance(self.n_samples, int) or self.n_samples <= 0:
            raise ConfigError("task.n_samples", "must be a positive integer", self.n_samples)
        if not isinstance(self.n_shot, int) or self.n_shot < 0:
            raise ConfigError("task.n_shot", "must be a non-negative integer", self.n_shot)
        if self.max_input_tokens is not None and (not isinstance(self.max_input_tokens, int) or self.max_input_tokens <= 0):
            raise ConfigError("task.max_input_tokens", "must be a positive integer or null", self.max_input_tokens)
        if not isinstance(self.query_aware, bool):
            raise ConfigError("task.query_aware", "must be true or false", self.query_aware)
        if not self.query_aware and not self.splits_question:
            raise ConfigError("task.query_aware", f"{self.name} has no question apart from its context: only true",
                              self.query_aware)
        if self.prompt_style not in PROMPT_STYLES:
            raise ConfigError("task.prompt_style", f"must be one of {', '.join(PROMPT_STYLES)}", self.prompt_style)

    @property
    def splits_question(self) -> bool:
        """Whether samples say where their question starts (`Sample.question_at`): query_aware=false possible."""
        return False

    def question_tokens(self, tokenizer, sample: Sample, ids: list[int]) -> int:
        """Tokens at the end of `ids` (the sample's prompt) that form its question: 0 when query-aware.

        The prompt is tokenised whole (the same ids as the query-aware run); the question starts at the
        first token that begins at or after `question_at`."""
        if self.query_aware or sample.question_at is None:
            return 0
        offsets = tokenizer(sample.prompt, add_special_tokens=self.add_special_tokens,
                            return_offsets_mapping=True)["offset_mapping"]
        starts = [a for a, b in offsets]
        if len(starts) != len(ids):
            raise ValueError("the prompt's offsets do not match its ids")
        first = next((i for i, (a, b) in enumerate(offsets) if b > a and a >= sample.question_at), len(ids))
        return len(ids) - first

    def check_data(self) -> None:
        """Preflight: read and check every data row the run will use (no model); ConfigError if bad."""

    @classmethod
    def default_new_tokens(cls, settings) -> int | None:
        """The generation length the task publishes (RULER's per task), given its config node `settings`: what a
        run generates when gen.max_new_tokens is null; None: the task has none (kvbench's default applies)."""
        return None

    def generation_departure(self, new_tokens: int) -> str | None:
        """The record's extension when `new_tokens` (gen.max_new_tokens) is not the task's published length."""
        return None

    # ------------------------------------------------------------------ prompts
    def samples(self, tokenizer) -> list[Sample]:
        raise NotImplementedError

    def rng(self) -> random.Random:
        return random.Random(self.seed)

    @property
    def add_special_tokens(self) -> bool:
        """Chat templates write their own special tokens; plain prompts get the tokenizer's (BOS)."""
        return self.prompt_style == "plain"

    def encode(self, tokenizer, prompt: str) -> list[int]:
        return tokenizer(prompt, add_special_tokens=self.add_special_tokens)["input_ids"]

    def render(self, tokenizer, turns: list[tuple[str, str]], question: str, answer_prefix: str = "") -> str:
        """A prompt from few-shot (user, assistant) turns and the final user message.

        chat: the tokenizer's chat template, exemplars as previous turns; plain: blank-line separated
        blocks for base models. `answer_prefix` starts the assistant's reply.
        """
        if self.prompt_style == "chat":
            if not getattr(tokenizer, "chat_template", None):
                raise ConfigError("task.prompt_style", "this tokenizer has no chat template; use plain", "chat")
            messages = []
            for user, assistant in turns:
                messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
            messages.append({"role": "user", "content": question})
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            return text + answer_prefix
        blocks = [f"{user}\n{assistant}" for user, assistant in turns] + [question]
        return "\n\n".join(blocks) + "\n" + answer_prefix

    # ------------------------------------------------------------------ scoring
    def cut_at_stop(self, text: str) -> str:
        """Cut a generation at the first stop string (after its leading whitespace)."""
        text = text.lstrip()
        for s in self.stop_strings:
            i = text.find(s)
            if i >= 0:
                text = text[:i]
        return text

    def extract(self, text: str) -> str:
        return text.strip()

    def score(self, answer: str, references: list[str]) -> dict[str, float]:
        raise NotImplementedError

    def aggregate(self, scores: list[dict[str, float]]) -> dict[str, float]:
        keys = scores[0].keys() if scores else []
        return {k: sum(s[k] for s in scores) / len(scores) for k in keys}

    def describe(self) -> dict:
        return {"task": self.name, "metric": self.metric, "query_aware": self.query_aware}

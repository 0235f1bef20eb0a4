"""kvbench.config.prompt_lengths.prompt_token_lengths: the one count of a task's prompts in tokens (the preflight's
and kvbench-plan's)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kvbench.config.prompt_lengths import prompt_token_lengths
from kvbench.errors import ConfigError


@dataclass
class _Sample:
    index: int
    prompt: str


class _Task:
    name = "words"

    def __init__(self, prompts):
        self.prompts = prompts

    def samples(self, tok):
        return [_Sample(i + 10, p) for i, p in enumerate(self.prompts)]

    def encode(self, tok, prompt):
        return tok(prompt)


def _words(text):  # a tokenizer: one token a word
    return text.split()


def test_each_prompt_counted_in_order():
    assert prompt_token_lengths(_Task(["a b c", "d", "e f"]), _words) == [3, 1, 2]


def test_a_row_that_renders_empty_is_refused_by_its_index():
    with pytest.raises(ConfigError, match="row 11 renders to an empty prompt"):
        prompt_token_lengths(_Task(["a", "  ", ""]), _words)

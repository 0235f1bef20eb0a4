"""kvbench.capacity.plan_prompts: plan.prompt_tokens for every sample, else the preflight's lengths; a tokenizer
that cannot be had names plan.prompt_tokens, a prompt the task cannot render names the task's key."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from kvbench import models
from kvbench.capacity import prompt_lengths
from kvbench.config import CONF_DIR, build_task
from kvbench.errors import ConfigError
from kvbench.models.tiny import byte_tokenizer

TINY = ["model=tiny-llama", "device=cpu", "task=passkey", "task.n_samples=3", "task.context_tokens=40"]


def _cfg(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=[*TINY, *overrides])


def test_the_worst_case_length_for_every_sample():
    assert prompt_lengths(_cfg("plan.prompt_tokens=500")) == ([500, 500, 500], "plan.prompt_tokens")


def test_the_tasks_own_lengths_with_the_models_tokenizer():
    cfg = _cfg("task.prompt_style=plain")
    lengths, source = prompt_lengths(cfg)
    assert source == "passkey prompts (3 samples)"
    # the tiny models' tokenizer is one token per UTF-8 byte: a plain prompt is as long as its text in bytes
    prompts = [s.prompt for s in build_task(cfg).samples(byte_tokenizer())]
    assert lengths == [len(p.encode()) for p in prompts]


def test_a_tokenizer_offline_names_plan_prompt_tokens(monkeypatch):
    def offline(cfg):
        raise OSError("We couldn't connect to 'https://huggingface.co'")

    monkeypatch.setitem(models.TOKENIZERS, "kvbench.models.build_tiny", offline)
    with pytest.raises(ConfigError, match=r"\(OSError; offline\?\)") as e:
        prompt_lengths(_cfg("task.context_tokens=41"))  # another task config: not the preflight's cached lengths
    assert e.value.key == "plan.prompt_tokens"


def test_a_task_that_refuses_its_prompts_names_its_own_key(monkeypatch):
    task = type(build_task(_cfg()))

    def refuse(self, tokenizer):
        raise ConfigError("task.max_input_tokens", "is too small for the prompt's fixed part", 2)

    monkeypatch.setattr(task, "samples", refuse)
    with pytest.raises(ConfigError) as e:
        prompt_lengths(_cfg("task.context_tokens=42"))  # not the preflight's cached lengths
    assert e.value.key == "task.max_input_tokens"

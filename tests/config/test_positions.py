"""kvbench.config.positions: a run past the positions the model's config declares is refused before any weight loads,
by `kvbench` and `kvbench-plan` alike, in one line naming the key (gen.max_new_tokens, a RULER task.context_length,
plan.prompt_tokens); RoPE scaling that extends the model, or a config without a length, refuses nothing more."""

from __future__ import annotations

import pytest
from transformers import GPT2Config, LlamaConfig, PretrainedConfig

from kvbench import capacity, cli
from kvbench import run as kvrun
from kvbench.config.positions import max_positions
from kvbench.errors import ConfigError
from kvbench.results import read_records
from tests.capacity.test_plan import _compose
from tests.conftest import assert_one_line_exit_2

TINY = ["model=tiny-llama", "task=passkey", "task.n_samples=2"]  # the tiny models take 8192 positions


@pytest.mark.parametrize("config,limit", [
    (LlamaConfig(max_position_embeddings=4096), 4096),
    (LlamaConfig(max_position_embeddings=32768, rope_parameters=dict(  # Qwen2.5's documented long setting
        rope_type="yarn", rope_theta=1e6, factor=4.0, original_max_position_embeddings=32768)), 131072),
    (LlamaConfig(max_position_embeddings=4096, rope_parameters=dict(rope_type="linear", rope_theta=1e4, factor=2.0)),
     8192),
    (LlamaConfig(max_position_embeddings=4096, rope_parameters=dict(rope_type="dynamic", rope_theta=1e4, factor=2.0)),
     8192),
    (LlamaConfig(max_position_embeddings=131072, rope_parameters=dict(  # Llama 3.1: the field is the extended one
        rope_type="llama3", rope_theta=5e5, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=8192)), 131072),
    (GPT2Config(n_positions=1024), 1024),
    (PretrainedConfig(), None),  # no length field: any length
], ids=["plain", "yarn", "linear", "dynamic", "llama3", "gpt2", "none"])
def test_the_positions_are_what_the_config_declares(config, limit):
    assert max_positions(config) == limit


@pytest.fixture
def no_model_loading(monkeypatch):
    monkeypatch.setattr(kvrun.models, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))


@pytest.mark.parametrize("args,key", [
    (["gen.max_new_tokens=100000000"], "gen.max_new_tokens"),  # minutes of the account's replay, no token
    (["gen.max_new_tokens=8000"], "gen.max_new_tokens"),  # the prompts + 8000 pass 8192
    (["task=niah_single_1", "task.context_length=9000"], "task.context_length"),  # before its prompts are rendered
], ids=["absurd", "past", "ruler"])
def test_kvbench_refuses_a_run_past_the_models_positions(args, key, tmp_path, capsys, no_model_loading):
    err = assert_one_line_exit_2(cli.main, [*TINY, *args, f"results_dir={tmp_path}"], capsys, key)
    assert "8192 positions tiny-llama takes" in err, err
    assert not (tmp_path / "runs.jsonl").exists()


def test_the_limit_is_prompt_plus_new_tokens(tmp_path):
    """The longest prompt + gen.max_new_tokens may reach the positions, not pass them."""
    from kvbench.config import prepare
    from kvbench.config.positions import check_positions
    from kvbench.config.preflight import model_config, prompt_lengths

    cfg = _compose(*TINY, f"results_dir={tmp_path}")
    prepare(cfg)
    lengths = prompt_lengths(cfg)
    cfg.gen.max_new_tokens = 8192 - max(lengths)
    check_positions(cfg, model_config(cfg), lengths)
    cfg.gen.max_new_tokens += 1
    with pytest.raises(ConfigError, match=f"gen.max_new_tokens={8193 - max(lengths)}"):
        check_positions(cfg, model_config(cfg), lengths)


@pytest.mark.parametrize("args,key", [
    (["gen.max_new_tokens=100000000"], "gen.max_new_tokens"),
    (["task=niah_single_1", "task.context_length=9000"], "task.context_length"),
    (["plan.prompt_tokens=9000"], "plan.prompt_tokens"),
], ids=["absurd", "ruler", "prompt_tokens"])
def test_kvbench_plan_refuses_a_plan_past_the_models_positions(args, key, tmp_path):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as e:
        capacity.plan(_compose(*TINY, "memory.limit_gb=1", *args, f"results_dir={tmp_path}"))
    assert "8192 positions tiny-llama takes" in str(e.value) and "\n" not in str(e.value)
    assert not read_records(tmp_path)

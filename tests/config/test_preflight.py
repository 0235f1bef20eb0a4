"""kvbench.config.preflight: what a run needs beyond its config, checked before any model loads.

task.query_aware=false with a budget that cannot hold the question is refused from the prompts' lengths, by the
engine's own rule (kvbench.budgets.question): at the boundary the preflight finds, the engine fails one pair
below and runs at it, on models with windowed layers, per-layer budgets, sinks and prefill evictions alike.
"""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from kvbench import cli, engine
from kvbench import run as kvrun
from kvbench.config import CONF_DIR, build_policy, build_task, prepare
from kvbench.config.preflight import check_question_room
from kvbench.config.prompt_lengths import prompt_lengths, question_lengths
from kvbench.errors import ConfigError
from tests.conftest import assert_one_line_exit_2

AGNOSTIC = ["task=niah_single_1", "task.query_aware=false", "task.n_samples=1", "gen.max_new_tokens=2"]


@pytest.fixture
def no_model_loading(monkeypatch):
    monkeypatch.setattr(kvrun.models, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))


@pytest.mark.parametrize("args", [
    ["model=tiny-llama", "task.context_length=700", "policy=extreme_decode"],  # a 166-token question, 2 pairs
    ["model=tiny-llama", "model.arch=gpt-oss", "task.context_length=700", "policy=h2o", "policy.kv_size=96"],
    ["model=tiny-llama", "model.arch=gemma2", "task.context_length=700", "policy=h2o", "policy.kv_size=96"],
    # DuoAttention's streaming heads while running: the nameless tiny model's pattern keeps 2 + 10 pairs (issue 58)
    ["model=tiny-llama", "task.context_length=700", "policy=duo_attention", "policy.schedule=prefill_and_decode"],
    ["model=tiny-llama", "task.context_length=700", "policy=duo_attention", "policy.schedule=decode_only"],
], ids=["extreme_decode", "h2o-gpt-oss", "h2o-gemma2", "duo-prefill_and_decode", "duo-decode_only"])
def test_a_question_the_budget_cannot_hold_is_refused_before_the_model(args, tmp_path, capsys, no_model_loading):
    err = assert_one_line_exit_2(cli.main, [*AGNOSTIC, *args, f"results_dir={tmp_path}"], capsys, "task.query_aware")
    assert "a question of" in err and "leaves no room" in err
    assert not (tmp_path / "runs.jsonl").exists()


def _cfg(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[*AGNOSTIC, "task.context_length=700", *overrides])
    prepare(cfg)
    return cfg


def _preflight_refuses(cfg, kv: int) -> bool:
    cfg.policy.kv_size = kv
    try:
        build_policy(cfg)
    except ConfigError:
        return True  # a budget the policy itself refuses
    try:
        check_question_room(cfg, prompt_lengths(cfg))
    except ConfigError as e:
        assert e.key == "task.query_aware", e
        return True
    return False


def _engine_refuses(cfg, kv: int) -> bool:
    cfg.policy.kv_size = kv
    lm = instantiate(cfg.model, device="cpu")
    task = build_task(cfg)
    samples = task.samples(lm.tokenizer)
    ids = [task.encode(lm.tokenizer, s.prompt) for s in samples]
    try:
        engine.generate(lm.model, lm.tokenizer, ids, build_policy(cfg), batch_size=1, max_new_tokens=2,
                        prefill_chunk=cfg.gen.prefill_chunk, question_tokens=kvrun.static.question_tokens(
                            task, lm, samples, ids))
    except ValueError as e:
        assert "leaves no room" in str(e), e
        return True
    return False


@pytest.mark.parametrize("overrides", [
    ["model=tiny-llama", "policy=h2o"],  # half the budget protected (protect_recent=null)
    ["model=tiny-llama", "policy=window", "gen.prefill_chunk=64"],  # the context evicted during prefill
    ["model=tiny-llama", "model.arch=gpt-oss", "policy=knorm", "policy.evict_every=8", "policy.protect_first=4"],
    # per-layer budgets, the top layer's the smallest but windowed (W=20): only the full layer 0 is compressed
    ["model=tiny-llama", "model.arch=qwen2-window", "policy=pyramidkv", "policy.evict_every=8"],
], ids=["h2o", "window-prefill", "knorm-gpt-oss-sinks", "pyramidkv-qwen2-window"])
def test_the_preflight_refuses_exactly_what_the_engine_cannot_run(overrides):
    cfg = _cfg(*overrides)
    (questions, _), lengths = question_lengths(cfg), prompt_lengths(cfg)
    lo, hi = questions[0], lengths[0]  # a budget of the question refuses (it must evict), the whole prompt runs
    assert _preflight_refuses(cfg, lo) and not _preflight_refuses(cfg, hi)
    while hi - lo > 1:  # the smallest budget the preflight lets run
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _preflight_refuses(cfg, mid) else (lo, mid)
    assert lengths[0] > hi  # the question really is compressed against
    assert _engine_refuses(cfg, lo) and not _engine_refuses(cfg, hi), (lo, hi)

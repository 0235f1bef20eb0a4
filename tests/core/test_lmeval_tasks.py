"""kvbench-lm-eval refuses, before any model loads, tasks kvbench's model cannot run with the chosen policy (issue
58, defect 8): log-likelihood tasks (multiple choice) with a policy that cannot score them (`no_loglikelihood`), and
perplexity tasks (`loglikelihood_rolling`) with any policy. One line, exit code 2, nothing of lm_eval's run started;
before, every generation request ran first and the run then ended at the first log-likelihood request, writing no
results.

Each task's request type is read from its config (kvbench/lmeval_tasks.py: a task's `output_type`, a group's members,
a tag's tasks); a task given as a YAML path is built by lm_eval (its dataset, no model) and its type read.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("lm_eval", reason="lm_eval is not installed (pip install 'kvbench[lm-eval]')")

from kvbench.errors import ConfigError  # noqa: E402
from kvbench.policies import registry  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "tests" / "data" / "lm_eval"


@pytest.fixture(scope="module")
def manager():
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(TASKS))


@pytest.fixture(autouse=True)
def _in_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # the task YAMLs name their JSONL relative to the repository root


def no_load(cfg):
    raise AssertionError("the model was loaded")


def refused(argv: list[str], monkeypatch, capsys) -> list[str]:
    """The stderr lines of `kvbench-lm-eval argv`, which must exit with code 2 without loading the model."""
    from kvbench.lmeval import main
    from kvbench.run import models

    monkeypatch.setattr(models, "load_model", no_load)
    monkeypatch.setattr(sys, "argv", ["kvbench-lm-eval", *argv])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main()
    out = capsys.readouterr()
    assert exc.value.code == 2, out.err[-2000:]
    assert out.out == "", out.out[-2000:]
    return out.err.strip().splitlines()


def test_a_policy_without_loglikelihood_is_refused_before_the_model_loads(monkeypatch, capsys, tmp_path):
    """The reported case: a generation task and a multiple-choice task with KVzip."""
    assert registry()["kvzip"].no_loglikelihood
    err = refused(["--model", "kvbench", "--model_args", "model=tiny-llama,policy=kvzip", "--tasks",
                   "kvbench_tiny_gen,kvbench_tiny_mc", "--include_path", str(TASKS), "--output_path", str(tmp_path)],
                  monkeypatch, capsys)
    assert len(err) == 1, err
    assert err[0].startswith("kvbench-lm-eval: error: policy=kvzip: does not run on log-likelihood requests "
                             f"({registry()['kvzip'].no_loglikelihood})"), err
    assert "kvbench_tiny_mc (multiple_choice)" in err[0] and "kvbench_tiny_gen" not in err[0], err
    assert not list(tmp_path.rglob("*"))


def test_a_perplexity_task_is_refused_before_the_model_loads(monkeypatch, capsys):
    err = refused(["--model", "kvbench", "--model_args", "model=tiny-llama,policy=full", "--tasks",
                   "kvbench_tiny_gen", "kvbench_tiny_rolling", "--include_path", str(TASKS)], monkeypatch, capsys)
    assert len(err) == 1, err
    assert err[0].startswith("kvbench-lm-eval: error: tasks=kvbench_tiny_rolling: is a loglikelihood_rolling "
                             "(perplexity) task"), err


def test_output_types_from_configs(manager):
    from kvbench.lmeval_tasks import output_types

    assert output_types(["kvbench_tiny_gen", "kvbench_tiny_mc"], manager) == {
        "kvbench_tiny_gen": "generate_until", "kvbench_tiny_mc": "multiple_choice"}
    assert output_types(["kvbench_tiny_both"], manager) == {  # a group: its members
        "kvbench_tiny_gen": "generate_until", "kvbench_tiny_mc": "multiple_choice"}
    assert output_types(["kvbench_tiny_r*"], manager) == {"kvbench_tiny_rolling": "loglikelihood_rolling"}  # a glob
    assert output_types([str(TASKS / "kvbench_tiny_mc.yaml")], manager) == {  # a path: built by lm_eval
        "kvbench_tiny_mc": "multiple_choice"}
    assert output_types(["no_such_task"], manager) is None  # unknown: lm_eval says so itself


def test_what_is_refused_and_what_runs():
    """No task is refused to a policy that scores log-likelihoods, nor a generation task to one that cannot."""
    from kvbench.lmeval_tasks import refuse_unrunnable

    kvzip, h2o = registry()["kvzip"](), registry()["h2o"]()
    gen, mc = {"g": "generate_until"}, {"m": "multiple_choice", "l": "loglikelihood"}
    refuse_unrunnable(kvzip, gen)
    refuse_unrunnable(h2o, {**gen, **mc})
    refuse_unrunnable(h2o, None)  # types unknown: lm_eval's run reports what it must
    with pytest.raises(ConfigError, match=r"^policy=kvzip: .* tasks m \(multiple_choice\), l \(loglikelihood\)"):
        refuse_unrunnable(kvzip, {**gen, **mc})
    with pytest.raises(ConfigError, match="^tasks=r: is a loglikelihood_rolling"):
        refuse_unrunnable(h2o, {**gen, "r": "loglikelihood_rolling"})

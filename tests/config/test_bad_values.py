"""Values that ran as something else, or failed naming no key (issue 58): each is refused in one line naming its key,
exit code 2, before any model loads, by `kvbench` and `kvbench-plan` alike.

- a negative `policy.n_sink` (KVzip, KVzip+, KVgrad, ExpectedAttention ran it as 0; LagKV already refused it);
- `policy.n_future_positions=0` (ExpectedAttention's expected query over no future position);
- `model.layers` below 1 (the tiny models: "max() arg is an empty sequence", no key named).

And offline, a `model=` whose shipped config transformers warns about (Phi-4-mini's longrope fields) prints that one
line alone, no warning before it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvbench import capacity, cli
from kvbench import run as kvrun
from tests.conftest import assert_one_line_exit_2

TINY = ["model=tiny-llama", "task.n_samples=1", "task.context_tokens=32", "gen.max_new_tokens=2"]
BAD = {
    "policy=kvzip policy.n_sink=-1": "policy.n_sink=-1",
    "policy=kvzip_plus policy.n_sink=-1": "policy.n_sink=-1",
    "policy=kvgrad policy.n_sink=-2": "policy.n_sink=-2",
    "policy=expected_attention policy.n_sink=-1": "policy.n_sink=-1",
    "policy=expected_attention policy.n_future_positions=0": "policy.n_future_positions=0",
    "model.layers=0": "model.layers=0",
    "model.layers=-1": "model.layers=-1",
}


@pytest.fixture
def no_model_loading(monkeypatch):
    monkeypatch.setattr(kvrun.models, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))


@pytest.mark.parametrize("args", list(BAD))
def test_refused_in_one_line_by_kvbench_and_kvbench_plan(args, tmp_path, capsys, no_model_loading):
    assert_one_line_exit_2(cli.main, [*TINY, *args.split(), f"results_dir={tmp_path}"], capsys, BAD[args])
    assert not (tmp_path / "runs.jsonl").exists()
    with pytest.raises(SystemExit) as exc:
        capacity.main([*TINY, *args.split(), "memory.limit_gb=10", f"results_dir={tmp_path}"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and err.startswith(f"kvbench-plan: error: {BAD[args]}:") and "\n" not in err, err


@pytest.mark.parametrize("hub", ["offline", "unreachable"])
@pytest.mark.parametrize("command", ["kvbench", "kvbench.capacity"])
def test_offline_a_shipped_config_prints_the_one_line_alone(command, hub, tmp_path):
    """transformers warns while building Phi-4-mini's shipped config (its longrope fields, a note to the model's
    authors); offline (HF_HUB_OFFLINE) or where the Hub does not answer (no HF_HUB_OFFLINE: huggingface_hub retried
    the tokenizer's files for about 45 s, a warning line per try), its tokenizer and weights cannot be had: the line
    saying so is all that is printed. In a process of its own: transformers' handler writes to the stderr it found
    at import."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    env.update({"HF_HUB_OFFLINE": "1"} if hub == "offline" else {"HF_HUB_OFFLINE": "0",
                                                                 "HF_ENDPOINT": "http://127.0.0.1:9"})  # refused
    out = subprocess.run([sys.executable, "-m", command, "model=phi4-mini", "memory.limit_gb=10",
                          f"results_dir={tmp_path}"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    err = out.stderr.strip()
    assert out.returncode == 2 and "\n" not in err and err.startswith(f"{command.replace('.capacity', '-plan')}: error: "), err

"""Every console script answers bad input with one line on stderr and exit code 2, before any model loads.

Each command of pyproject's [project.scripts] runs as installed (the venv's console script, beside
sys.executable) in its own process, offline (HF_HUB_OFFLINE=1, an empty Hugging Face home: nothing can be
downloaded, and no weights are cached), with a typo'd key, a value of the wrong type and an unknown name,
plus the refusals that once needed more than the config (a model whose shipped config refuses serve mode)
or ended in a traceback (an empty or unclosed `--policy` of kvbench-needle). The processes start together,
a few at a time, so the module stays quick.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
TINY = ["model=tiny-llama", "task.n_samples=1", "gen.max_new_tokens=2"]
# script -> [(case id, argv, a fragment its one line names)]
CASES = {
    "kvbench": [
        ("typo", [*TINY, "policy=h2o", "policy.kv_sise=64"], "policy.kv_sise"),
        ("type", [*TINY, "batch_size=abc"], "batch_size"),
        ("model", ["model=tiny-lama"], "model=tiny-lama: unknown option"),
        ("policy", [*TINY, "policy=h2oo"], "policy=h2oo: unknown option"),
        ("serve-config-only", ["model=gemma3-4b", "mode=serve"], "serve mode runs full attention only"),
    ],
    "kvbench-plan": [
        ("typo", [*TINY, "plan.gpu=2"], "plan.gpu"),
        ("type", [*TINY, "plan.gpus=two"], "plan.gpus"),
        ("model", ["model=tiny-lama"], "model=tiny-lama: unknown option"),
    ],
    "kvbench-reproduce": [
        ("typo", [*TINY, "reproduce.kv_setp=64"], "reproduce.kv_setp"),
        ("type", [*TINY, "reproduce.kv_step=abc"], "reproduce.kv_step"),
        ("task", [*TINY, "task=niah_singel_1"], "task=niah_singel_1: unknown option"),
        ("value", [*TINY, "reproduce.kv_step=0"], "reproduce.kv_step=0"),
    ],
    "kvbench-needle": [
        ("typo", ["--lenghts", "512", *TINY], "--lenghts"),
        ("type", ["--depths", "half", *TINY], "--depths"),
        ("policy", ["--policy", "h2oo", *TINY], "policy=h2oo: unknown option"),
        ("empty-policy", ["--policy", "", *TINY], "--policy ''"),
        ("unclosed-quote", ["--policy", "h2o policy.kv_size='64", *TINY], "No closing quotation"),
    ],
    "kvbench-report": [
        ("typo", ["{tmp}", "--near-fvk", "0.9"], "--near-fvk"),
        ("type", ["{tmp}", "--near-fkv", "most"], "--near-fkv"),
        ("folder", ["{tmp}/nowhere"], "has no runs.jsonl"),
        ("value", ["{tmp}", "--near-fkv", "2"], "--near-fkv"),
    ],
    "kvbench-gpu-check": [
        ("typo", ["--budget-bach", "24"], "--budget-bach"),
        ("type", ["--budget-batch", "abc"], "--budget-batch"),
        ("value", ["--budget-batch", "7"], "divisor of 960"),
        ("tokens", ["--prompt-tokens", "0"], "--prompt-tokens"),
    ],
}
# the lm-eval adapter's refusals (its console script with typos, wrong types, unknown names) are
# tests/core/test_lmeval_args.py's
ELSEWHERE = {"kvbench-lm-eval"}
IDS = [f"{script}:{case}" for script, cases in CASES.items() for case, _, _ in cases]


def test_every_console_script_is_driven_here():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(CASES) | ELSEWHERE == set(scripts)


@pytest.fixture(scope="module")
def answers(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """Every case's process, run a few at a time: case id -> its completed process."""
    tmp = tmp_path_factory.mktemp("entry_points")
    (tmp / "runs.jsonl").write_text("")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp / "hf"), "WANDB_MODE": "disabled"}
    bin_dir = Path(sys.executable).parent

    def run(case: str, script: str, argv: list[str]) -> subprocess.CompletedProcess:
        exe = bin_dir / script
        assert exe.is_file(), f"{exe} is not installed (pip install -e . installs every console script)"
        argv = [a.replace("{tmp}", str(tmp)) for a in argv]
        if script in ("kvbench", "kvbench-reproduce", "kvbench-needle", "kvbench-plan"):
            argv.append(f"results_dir={tmp / case.replace(':', '_')}")  # its own: nothing must be written there
        return subprocess.run([str(exe), *argv], capture_output=True, text=True, env=env, cwd=tmp, timeout=300)

    jobs = [(f"{script}:{case}", script, argv) for script, cases in CASES.items() for case, argv, _ in cases]
    with ThreadPoolExecutor(max_workers=4) as pool:
        done = list(pool.map(lambda job: run(*job), jobs))
    return dict(zip(IDS, done, strict=True))


@pytest.mark.parametrize("case", IDS)
def test_bad_input_is_one_line_and_exit_2(case, answers):
    script, name = case.split(":")
    fragment = next(f for n, _, f in CASES[script] if n == name)
    p = answers[case]
    err = p.stderr.strip()
    assert "Traceback" not in p.stderr, p.stderr[-2000:]
    assert p.returncode == 2, (p.returncode, err[-2000:])
    assert "\n" not in err and err.startswith(f"{script}: error: "), err
    assert fragment in err, err
    if p.args[-1].startswith("results_dir="):  # nothing recorded
        assert not (Path(p.args[-1].removeprefix("results_dir=")) / "runs.jsonl").exists()

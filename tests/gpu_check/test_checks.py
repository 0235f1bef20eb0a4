"""kvbench.gpu_check (`kvbench-gpu-check`, `make gpu-check`) on a machine without CUDA: its checks are pure functions of
measured numbers, tested here on made-up figures; the JSON lines parse; and without a GPU it prints
one line and exits 77 (skipped), which `make` reports as a failure ("Error 77"), never success."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ["-m", "kvbench.gpu_check"]  # what the console script kvbench-gpu-check runs


@pytest.fixture(scope="module")
def gc_mod():
    return importlib.import_module("kvbench.gpu_check")


def test_compare_tokens(gc_mod):
    same = gc_mod.compare_tokens([[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 5]], None, 0.05)
    assert same == {"ok": True, "exact": True, "diverged": []}
    margins = [[3.0, 2.0, 0.01], [1.0, 0.02]]
    tie = gc_mod.compare_tokens([[1, 2, 9], [4, 5]], [[1, 2, 3], [4, 5]], margins, 0.05)
    assert tie["ok"] and not tie["exact"] and tie["diverged"] == [
        {"sample": 0, "step": 2, "ref_margin": 0.01, "near_tie": True}]
    wrong = gc_mod.compare_tokens([[1, 7, 3], [4, 5]], [[1, 2, 3], [4, 5]], margins, 0.05)
    assert not wrong["ok"] and wrong["diverged"][0]["step"] == 1 and not wrong["diverged"][0]["near_tie"]
    assert not gc_mod.compare_tokens([[1, 7]], [[1, 2]], None, 0.05)["ok"]  # no margins: only exact passes
    shorter = gc_mod.compare_tokens([[1, 2]], [[1, 2, 3]], [[5.0, 5.0, 5.0]], 0.05)  # stopped early, no tie
    assert not shorter["ok"] and shorter["diverged"][0]["step"] == 2
    with pytest.raises(ValueError):  # a missing sample is an error, not a pass
        gc_mod.compare_tokens([[1]], [[1], [2]], None, 0.05)


@pytest.mark.parametrize("measured, ok", [(1000, True), (1099, True), (901, True), (1101, False), (899, False)])
def test_memory_ratio(gc_mod, measured, ok):
    r = gc_mod.memory_ratio(accounted=1000, measured=measured, weights=600)
    assert r["ok"] is ok and r["ratio"] == measured / 1000
    assert r["transient_ratio"] == round((measured - 600) / 400, 4)


def test_search_prediction_and_check(gc_mod):
    cands = [1, 2, 3, 4, 5, 6, 8, 10, 12]
    fits = {b: b <= 6 for b in cands}
    assert gc_mod.predicted_search(cands, fits) == (6, 8)
    assert gc_mod.predicted_search(cands, {b: False for b in cands}) == (None, 1)
    assert gc_mod.predicted_search(cands, {b: True for b in cands}) == (12, None)
    ok = gc_mod.search_check(cands, 5, 6, 6, 8, [0, 0])
    assert ok["ok"] and (ok["searched"], ok["predicted"]) == (5, 6)
    assert not gc_mod.search_check(cands, 4, 5, 6, 8, [0])["ok"]  # two candidates below the prediction
    assert not gc_mod.search_check(cands, 6, 8, 6, 8, [0, 4096])["ok"]  # an oom trial left memory behind
    assert not gc_mod.search_check(cands, None, 1, 6, 8, [])["ok"]  # nothing fitted


def test_runs_and_device_map_checks(gc_mod):
    assert gc_mod.runs_check(["ok"])["ok"] and not gc_mod.runs_check(["oom"])["ok"] and not gc_mod.runs_check([])["ok"]
    peaks = {"cuda:0": 10, "cuda:1": 12}
    assert gc_mod.device_map_check([[1, 2]], [[1, 2]], peaks)["ok"]
    assert not gc_mod.device_map_check([[1, 2]], [[1, 3]], peaks)["ok"]
    assert not gc_mod.device_map_check([[1, 2]], [[1, 2]], {"cuda:0": 10})["ok"]  # not split
    assert not gc_mod.device_map_check([[1, 2]], [[1, 2]], None)["ok"]


def test_backends_to_check(gc_mod):
    from kvbench.attention import BACKENDS

    got = gc_mod.available_backends(BACKENDS, flash_installed=False)
    assert "auto" not in got and "flash" not in got and "sdpa" in got
    assert "flash" in gc_mod.available_backends(BACKENDS, flash_installed=True)
    assert gc_mod.available_backends(["auto", "sdpa", "flash", "eager"], False) == ["sdpa", "eager"]
    assert not gc_mod.backend_runs("flash", "float32") and gc_mod.backend_runs("flash", "float16")
    assert gc_mod.backend_runs("sdpa", "float32")


def test_split_device_map_covers_a_llama(gc_mod, tiny_llama):
    from accelerate.utils import check_device_map

    model = tiny_llama.model
    n = len(model.get_decoder().layers)
    dm = gc_mod.split_device_map(n, 2, hasattr(model.get_decoder(), "rotary_emb"))
    check_device_map(model, dm)  # raises if a parameter is not placed
    layers = [dm[f"model.layers.{i}"] for i in range(n)]
    assert layers == sorted(layers) and set(layers) == {0, 1} and dm["model.norm"] == 1


def test_json_lines_and_summary(gc_mod):
    rows = [{"check": "parity", "case": "sdpa-float16-b4", "ok": True, "exact": True},
            {"check": "memory", "case": "full-b16", "ok": False, "ratio": 1.2}]
    lines = [json.loads(gc_mod.line(**r)) for r in rows]
    assert lines == rows
    s = json.loads(gc_mod.summary(rows, 12.345))
    assert s == {"summary": True, "ok": False, "checks": 2, "passed": 1, "failed": ["memory:full-b16"], "wall_s": 12.3}
    assert gc_mod.exit_code(rows) == 1 and gc_mod.exit_code(rows[:1]) == 0 and gc_mod.exit_code([]) == 1


def _no_cuda_env():
    return {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)}


def test_without_cuda_one_line_and_exit_77():
    p = subprocess.run([sys.executable, *SCRIPT], capture_output=True, text=True, env=_no_cuda_env(), timeout=120)
    assert p.returncode == 77, p.stderr[-2000:]
    (only,) = p.stdout.splitlines()
    got = json.loads(only)
    assert got["skipped"] is True and "no CUDA GPU" in got["message"]


def test_make_gpu_check_fails_with_77(tmp_path):
    """`make gpu-check` passes the skip on: make cannot exit 77 itself, it exits 2 naming "Error 77"."""
    stamp = tmp_path / "installed"
    stamp.touch()  # newer than pyproject.toml: `install` has nothing to do
    p = subprocess.run(["make", "-s", "-C", str(ROOT), "gpu-check", f"BIN={Path(sys.executable).parent}",
                        f"STAMP={stamp}"], capture_output=True, text=True, env=_no_cuda_env(), timeout=120)
    assert p.returncode != 0 and "Error 77" in p.stderr, (p.returncode, p.stderr)
    assert len(p.stdout.splitlines()) == 1 and json.loads(p.stdout)["skipped"] is True


# ------------------------------------------------------------------------------------- the glue, on CPU
def test_parity_glue_on_a_tiny_model(gc_mod, tiny_llama):
    """The parity glue (left-padded model.generate, EOS cut, margins) runs on any device: on CPU in
    float64 kvbench's full cache gives exactly model.generate's tokens."""
    from tests.conftest import random_prompts

    rows = gc_mod.parity_cases(tiny_llama, random_prompts((30, 17, 24, 9)), ["sdpa"], 1e-6, 8, "float64")
    assert [r["case"] for r in rows] == ["sdpa-float64-b1", "sdpa-float64-b4"]
    assert all(r["ok"] and r["exact"] for r in rows), rows


def test_search_glue_with_the_default_arguments(gc_mod, tmp_path):
    """The search / two-batches glue with kvbench-gpu-check's DEFAULT arguments (budget batch 24, 1024-token
    prompts, 32 new tokens) on tiny-llama under the CPU's accounted budget: the search finds exactly the
    accounted prediction, and two batches at that size run. (With its defaults the glue once set
    task.n_samples=8: the candidates were capped at 8 and `candidates.index(24)` raised on the first GPU run.)"""
    args = gc_mod.parse([])
    assert (args.budget_batch, args.prompt_tokens, args.new_tokens) == (24, 1024, 32)
    search, two = gc_mod.check_search_and_two_batches(args, tmp_path, base=("model=tiny-llama", "device=cpu"))
    assert search["check"] == "search" and search["ok"], search
    assert (search["searched"], search["predicted"], search["searched_b0"]) == (24, 24, 30)
    assert two == {"check": "two_batches", "batch_size": 24, "ok": True, "statuses": ["ok"]}


def test_search_samples_keep_the_candidates_the_search_needs(gc_mod):
    from kvbench.config import DIVISORS_OF_960

    assert gc_mod.search_samples(24) == 60  # the search doubles past 30 (the next candidate) before it bisects
    assert gc_mod.search_samples(6) == 16 and gc_mod.search_samples(160) == 240
    for bad in (7, 240, 480):
        with pytest.raises(ValueError, match="divisor of 960 below 240"):
            gc_mod.search_samples(bad)
    cands = [c for c in DIVISORS_OF_960 if c <= gc_mod.SEARCH_MAX]
    for b in cands[:-1]:  # every candidate up to twice the next one survives the cap
        n = gc_mod.search_samples(b)
        nxt = cands[cands.index(b) + 1]
        assert n >= min(2 * nxt, gc_mod.SEARCH_MAX) and n in cands


def test_a_bad_budget_batch_is_one_line_exit_2(gc_mod, capsys):
    with pytest.raises(SystemExit) as exc:
        gc_mod.main(["--budget-batch", "7"])
    assert exc.value.code == 2 and "divisor of 960" in capsys.readouterr().err


@pytest.mark.parametrize("gpus", [1, 2])
def test_main_runs_every_check_with_its_defaults(gc_mod, monkeypatch, capsys, gpus):
    """main() with no arguments and CUDA faked: every check runs once with the default arguments, one JSON line
    each and a summary; a check that raises is a failed line, not the end of the run."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    seen = []

    def fake(name):
        def check(args, tmp=None):
            seen.append((name, args.budget_batch, args.prompt_tokens, args.new_tokens))
            if name == "offload":
                raise RuntimeError("boom")
            return [{"check": name, "ok": True}]
        return check

    cli = importlib.import_module("kvbench.gpu_check.gpu_cli")  # main() calls the checks through its own module
    for name in ("check_parity", "check_memory", "check_syncs", "check_serve", "check_offload",
                 "check_search_and_two_batches", "check_device_map"):
        monkeypatch.setattr(cli, name, fake(name.removeprefix("check_")))
    assert gc_mod.main([]) == 1  # the offload check raised
    want = ["parity", "memory", "syncs", "serve", "offload", "search_and_two_batches"] + (["device_map"] if gpus > 1
                                                                                          else [])
    assert [s[0] for s in seen] == want and all(s[1:] == (24, 1024, 32) for s in seen)
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert len(lines) == len(want) + 1 and lines[-1]["summary"] and lines[-1]["failed"] == ["offload"]
    assert {"check": "offload", "ok": False, "error": "RuntimeError: boom"} in lines


def test_transient_and_syncs_checks(gc_mod):
    MiB = 2**20
    ok = gc_mod.transient_check(1000 * MiB, resident=5000 * MiB, allocated=6050 * MiB, reserved=6400 * MiB)
    assert ok["ok"] and ok["allocated_transient"] == 1050 * MiB and ok["reserved_ratio"] == 1.4
    # a transient 30% over the account fails, though the total is within 5% (what comparing totals hid)
    hidden = gc_mod.transient_check(1000 * MiB, resident=5000 * MiB, allocated=6300 * MiB, reserved=None)
    assert not hidden["ok"] and gc_mod.memory_ratio(6000 * MiB, 6300 * MiB, 5000 * MiB)["ok"]
    assert not gc_mod.transient_check(1000 * MiB, 5000 * MiB, 6000 * MiB, reserved=6600 * MiB)["ok"]  # reserved
    assert gc_mod.transient_check(1 * MiB, 5000 * MiB, 5020 * MiB, None)["ok"]  # within the slack
    assert gc_mod.syncs_check({"batch_max": 0.125, "pyramidkv": 0.125}, 0.125)["ok"]
    assert not gc_mod.syncs_check({"batch_max": 0.125, "pyramidkv": 1.0}, 2.0)["ok"]  # grows with the groups
    assert not gc_mod.syncs_check({"batch_max": 0.5}, 0.125)["ok"] and not gc_mod.syncs_check({}, 1)["ok"]

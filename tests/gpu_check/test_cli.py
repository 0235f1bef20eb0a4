"""kvbench.gpu_check.gpu_cli: the order of the checks (device_map only with two GPUs), and the console script
declared in pyproject.toml resolves to the CLI's entry (a stale path would break `kvbench-gpu-check`)."""

from __future__ import annotations

import importlib
from pathlib import Path

import tomllib

from kvbench.gpu_check import gpu_cli

ROOT = Path(__file__).resolve().parents[2]


def test_steps_in_order():
    assert [n for n, _ in gpu_cli.steps(1)] == ["parity", "memory", "syncs", "serve", "offload", "search"]
    assert [n for n, _ in gpu_cli.steps(2)][-1] == "device_map"


def test_console_script_points_at_the_entry():
    target = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["kvbench-gpu-check"]
    module, func = target.split(":")
    assert getattr(importlib.import_module(module), func) is gpu_cli.entry

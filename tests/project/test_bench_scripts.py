"""The scripts under scripts/ still fit the package they measure: each imports (a renamed module breaks it before
any benchmark runs), and what bench_eviction.py times still exists under the names it wraps."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p for p in (ROOT / "scripts").glob("*.py"))


def load(path: Path):
    sys.path.insert(0, str(path.parent))
    try:
        spec = importlib.util.spec_from_file_location(f"script_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)  # module level only: every script runs its work under __main__
        return module
    finally:
        sys.path.remove(str(path.parent))


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_every_script_imports(path):
    load(path)


def test_bench_eviction_times_functions_that_exist():
    module = load(ROOT / "scripts" / "bench_eviction.py")
    assert len(module.TIMED) == 4
    for owner, name, _ in module.TIMED:
        assert callable(getattr(owner, name, None)), f"{owner.__name__}.{name} is gone: bench_eviction.py times nothing"

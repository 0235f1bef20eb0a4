"""Load one of scripts/*.py as a module, as `python scripts/X.py` sees its neighbours (the scripts folder on the
import path while it loads): what the docs-figures tests recompute their tables with."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_script(name: str):
    """scripts/<name>.py as a module named `name`."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPTS))
    return module


def report_data(name: str, folder: Path):
    """(scripts/<name>.py as a module, the records in `folder`, the module's `rows` of them): what a report's
    figures test reads."""
    from kvbench.results import read_records

    module = load_script(name)
    records = read_records(folder)
    return module, records, module.rows(records)

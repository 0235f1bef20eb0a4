"""Behaviour unchanged by the refactor (issue 35): the configuration matrix's runs give the hashes and the
token ids, and its refusals the lines, that tests/data/golden.json holds (captured by `python -m tests.golden`
on the commit before the house was rebuilt); `make demo ALL=1`'s runs keep their config hashes.

The sides are independent: the snapshot was written by the old code, the replay runs the new.
"""

from __future__ import annotations

import json

import pytest

from tests.golden import GOLDEN, demo_hashes, make_mirror, run_one

SNAP = json.loads(GOLDEN.read_text())


@pytest.fixture(scope="module", autouse=True)
def mirror():
    return make_mirror()


@pytest.mark.parametrize("line", sorted(SNAP["matrix"]))
def test_matrix_run_unchanged(line, tmp_path):
    want = SNAP["matrix"][line]
    got = run_one(line.split(" "), tmp_path)
    assert got == want


def test_demo_hashes_unchanged():
    """Every recorded demo configuration hashes as recorded; a newly registered policy only adds its own."""
    got = demo_hashes()
    assert set(SNAP["demo"]) <= set(got) and {k: got[k] for k in SNAP["demo"]} == SNAP["demo"]

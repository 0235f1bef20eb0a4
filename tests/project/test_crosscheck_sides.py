"""scripts/crosscheck: the two sides run the same presses at the same ratios (no model, no kvpress).

compare.py compares each kvbench output with kvpress's output of the same press and ratio, so a press that one
side runs and the other leaves out fails the whole run after its hour of generation. kvpress's side runs the
presses of cases.py (KVzip, ExpectedAttention, DuoAttention...) only when CROSSCHECK_PRESSES names them; kvbench's
side must do the same, and run them at the ratios kvpress's side does (cases.RATIOS: 0.25 too, which ids.json,
made for the first presses, does not list).
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

FOLDER = Path(__file__).resolve().parents[2] / "scripts" / "crosscheck"


@pytest.fixture
def sides(monkeypatch):
    monkeypatch.syspath_prepend(str(FOLDER))  # the scripts import each other as their folder's modules
    return importlib.import_module("kvbench_side"), importlib.import_module("kvpress_side")


def test_a_plain_crosscheck_runs_the_presses_kvpresss_side_runs(sides, monkeypatch):
    kb, kp = sides
    monkeypatch.setattr(kb, "ONLY", [])
    assert {p for p in kb.COUNTERPARTS if kb.chosen(p)} == set(kp.PRESSES)


def test_a_named_press_runs_whatever_its_kind(sides, monkeypatch):
    kb, _ = sides
    monkeypatch.setattr(kb, "ONLY", ["kvzip", "snapkv"])
    assert {p for p in kb.COUNTERPARTS if kb.chosen(p)} == {"kvzip", "snapkv"}


def test_each_press_runs_at_the_ratios_kvpresss_side_runs_it_at(sides, monkeypatch):
    kb, _ = sides
    monkeypatch.setattr(kb, "ONLY_RATIOS", [])
    assert kb.ratios_of("kvzip", [0.5, 0.75]) == [0.25, 0.5, 0.75]  # cases.py's presses: cases.RATIOS
    assert kb.ratios_of("snapkv", [0.5, 0.75]) == [0.5, 0.75]  # the others: ids.json's
    assert kb.ratios_of("none", [0.5, 0.75]) == [0.0]
    monkeypatch.setattr(kb, "ONLY_RATIOS", [0.25])
    assert kb.ratios_of("kvzip", [0.5, 0.75]) == [0.25] and kb.ratios_of("snapkv", [0.5, 0.75]) == []

"""scripts/crosscheck: the two sides run the same presses at the same ratios (no model, no kvpress).

compare.py compares each kvbench output with kvpress's output of the same press and ratio, so a press that one
side runs and the other leaves out fails the whole run after its hour of generation. kvpress's side runs the
presses of cases.py (KVzip, ExpectedAttention, DuoAttention...) only when CROSSCHECK_PRESSES names them; kvbench's
side must do the same, and run them at the ratios kvpress's side does (cases.RATIOS: 0.25 too, which ids.json,
made for the first presses, does not list). kvbench's `prompts` step runs too, on a tiny mirror and tokenizer.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import SimpleNamespace

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


def test_prompts_writes_the_first_rows_of_the_test_split_in_order(sides, monkeypatch, tmp_path):
    """`kvbench_side.py prompts`: the first N_PROMPTS CNN/DM test rows (not a seeded draw), 0-shot, as token ids."""
    from kvbench.models.tiny import byte_tokenizer

    kb, _ = sides
    rows = [{"article": f"(CNN) Story {i}. " + "Words of the story. " * (3 + i), "highlights": f"Highlight {i} ."}
            for i in range(5)]
    folder = tmp_path / "data" / "cnn_dailymail"
    folder.mkdir(parents=True)
    (folder / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tok = byte_tokenizer()  # one token per byte, ChatML chat template
    monkeypatch.setattr(kb, "N_PROMPTS", 3)
    monkeypatch.setattr(kb, "load", lambda: SimpleNamespace(tokenizer=tok))  # no model: prompts only tokenize
    kb.prompts(tmp_path / "work", str(tmp_path / "data"))
    spec = json.loads((tmp_path / "work" / "ids.json").read_text())
    assert spec["references"] == [[f"Highlight {i} ."] for i in range(3)]
    for i, ids in enumerate(spec["ids"]):
        text = tok.decode(ids)
        assert text.startswith("<|im_start|>") and f"Story {i}." in text and text.endswith("Summary:"), text
    assert spec["ratios"] == list(kb.RATIOS) and spec["new_tokens"] == kb.NEW_TOKENS and spec["model_dir"]

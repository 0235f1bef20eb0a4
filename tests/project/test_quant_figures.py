"""docs/quantized.md and results/mini_quant: the committed table is its records rendered by
scripts/quant_report.py, and every figure the page reads out of it is recomputed here."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scripts import report_data

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "results" / "mini_quant"
PAGE = (ROOT / "docs" / "quantized.md").read_text()
MIB = 2**20


@pytest.fixture(scope="module")
def data():
    return report_data("quant_report", FOLDER)


def test_table_is_its_records(data):
    module, records, by = data
    assert module.render(records) == (FOLDER / "table.md").read_text()
    assert len(by) == 18  # 2 tasks x 3 policies x 3 widths, each ok
    assert {r["config"]["memory"]["limit_gb"] for r in by.values()} == {0.69}


def batch(by, task, policy, bits) -> int:
    return by[(task, policy, bits)]["search"]["max_batch_size"]


def test_the_batches_the_page_states(data):
    _, _, by = data
    for task in ("cnndm", "passkey"):
        assert [batch(by, task, "batch_max", b) for b in (32, 8, 4)] == [12, 12, 24]
    assert [batch(by, "cnndm", "full", b) for b in (32, 8, 4)] == [1, 2, 2]
    assert [batch(by, "passkey", "full", b) for b in (32, 8, 4)] == [1, 2, 3]
    assert [batch(by, t, "snapkv", b) for t in ("cnndm", "passkey") for b in (32, 8, 4)] == [1, 1, 1, 1, 1, 2]
    assert "Batch-Max fits 12 sequences at float32 and at int8,\n24 at int4" in PAGE


def test_the_peaks_per_sequence_the_page_states(data):
    _, _, by = data

    def per_seq(policy, bits):
        r = by[("cnndm", policy, bits)]
        return r["peak_kv_bytes"] / r["batch_size"] / MIB

    assert (round(per_seq("full", 4), 1), round(per_seq("full", 32), 1)) == (19.5, 92.8)
    assert round(per_seq("full", 4) / per_seq("full", 32), 2) == 0.21
    assert (round(per_seq("batch_max", 4), 1), round(per_seq("batch_max", 32), 1)) == (3.8, 11.2)
    assert round(per_seq("batch_max", 4) / per_seq("batch_max", 32), 2) == 0.34  # the target: below 0.35
    text = " ".join(PAGE.split())
    assert "(CNN/DM: 19.5 against 92.8 MiB), Batch-Max at 0.34 (3.8 against 11.2 MiB)" in text


def test_the_accuracies_the_page_states(data):
    module, _, by = data

    def m(task, policy, bits):
        return module.metric(by[(task, policy, bits)])[0]

    assert [f"{m('cnndm', 'full', b):.3f}" for b in (32, 8, 4)] == ["0.082", "0.084", "0.086"]
    assert [f"{m('cnndm', 'batch_max', b):.3f}" for b in (32, 8, 4)] == ["0.052", "0.062", "0.041"]
    assert [f"{m('cnndm', 'snapkv', b):.3f}" for b in (32, 8, 4)] == ["0.037", "0.033", "0.029"]
    assert [m("passkey", "full", b) for b in (32, 8, 4)] == [1.0, 1.0, 1.0]
    assert [round(m("passkey", "batch_max", b) * 24) for b in (32, 8, 4)] == [0, 0, 1]
    assert [m("passkey", "snapkv", b) for b in (32, 8, 4)] == [0.0, 0.0, 0.0]
    lo, hi = module.metric(by[("cnndm", "full", 32)])[1]
    for b in (8, 4):  # the quantized full cache within the float32 one's interval
        assert lo <= m("cnndm", "full", b) <= hi
    for v in ("0.082 at float32,\n0.084 at int8 and 0.086 at int4", "0.052, 0.062 and 0.041", "0.037, 0.033 and 0.029"):
        assert v in PAGE, v


def test_the_throughputs_the_page_states(data):
    _, _, by = data
    assert round(by[("cnndm", "full", 4)]["throughput_tok_s"], 1) == 2.0
    assert round(by[("cnndm", "full", 32)]["throughput_tok_s"], 1) == 5.7
    assert "2.0 tokens/s\nagainst 5.7" in PAGE


def test_the_bfloat16_plans_the_page_states():
    import json

    plans = [json.loads(line) for line in (FOLDER / "plan_bf16.jsonl").read_text().splitlines()]
    got = {p["kv_cache_dtype"]: next(r["max_batch_size"] for r in p["rows"] if r["attention"] == "sdpa"
                                      and r["method"] == "BM") for p in plans}
    assert got == {"auto": 12, "int8": 12, "int4": 24}
    assert "Batch-Max's largest batch is again 12 with the cache at 16 bits\nand at int8, 24 at int4" in PAGE

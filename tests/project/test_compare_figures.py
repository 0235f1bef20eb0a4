"""docs/compare.md and results/compare: the committed table is its records rendered by scripts/compare_report.py,
and every figure the page reads out of it (and the list of what is not yet run) is recomputed here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.scripts import report_data

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "results" / "compare"
PAGE = (ROOT / "docs" / "compare.md").read_text()
TEXT = " ".join(PAGE.split())


@pytest.fixture(scope="module")
def data():
    return report_data("compare_report", FOLDER)


def test_table_is_its_records(data):
    module, records, by = data
    assert module.render(records) == (FOLDER / "table.md").read_text()
    assert '--8<-- "results/compare/table.md"' in PAGE
    assert (FOLDER / "accuracy_vs_kv.png").is_file()
    assert all(r["n_samples"] == 4 and r["batch_size"] == 4 for r in by.values())
    assert {r["git_sha"] for r in by.values()} <= set(re.findall(r"[0-9a-f]{40}", (FOLDER / "README.md").read_text()))


def test_summary_and_completeness(data, monkeypatch):
    """The comparison's policies are those its records hold: a policy registered since is the sweep's next job
    (scripts/compare_sweep.py runs it, the report lists it as not yet run), not a change to the committed page."""
    import importlib

    module, records, by = data
    sweep = importlib.import_module("methods_cost")  # scripts/methods_cost.py, on the path as the report has it:
    # its `policies` is what the sweep and the report read (every registered one)
    compared, every = {k[2] for k in by}, sweep.policies
    monkeypatch.setattr(sweep, "policies", lambda only: [p for p in every(only) if p in compared])
    assert module.render_summary(records) == (FOLDER / "summary.md").read_text()
    assert module.render_missing(records) == (FOLDER / "missing.md").read_text()
    for name in ("summary", "missing"):
        assert f'--8<-- "results/compare/{name}.md"' in PAGE
    assert "not yet run" not in (FOLDER / "missing.md").read_text() and len(by) == 215  # every part complete


HELD_FULL = ("kvzip", "kvzip_plus", "kvgrad", "duo_attention")  # hold the full cache's bytes while decoding
NIAH = [(t, a) for t in ("niah1k", "niah2k") for a in (True, False)]


def _names(names) -> str:
    return ", ".join(f"`{n}`" for n in names[:-1]) + f" and `{names[-1]}`"


def test_what_the_page_reads(data):
    module, _, by = data
    policies = sorted({k[2] for k in by if k[2] != "full"})

    def acc(task, aware, policy, ratio):
        return module.metric(by[(task, aware, policy, ratio)])

    assert all(acc(t, a, "full", None)[0] == 1.0 for t, a in NIAH)
    every = {r: [p for p in policies if all(acc(t, a, p, r)[0] == 1.0 for t, a in NIAH)] for r in (0.5, 0.75)}
    none = [p for p in policies if all(acc(t, a, p, 0.5)[0] == 0.0 for t, a in NIAH)]
    assert f"{_names(every[0.5])} find it in 4 of 4 in all four niah columns" in TEXT
    assert f"the first group shrinks to {_names(every[0.75])}" in TEXT
    assert _names(none).replace("`kvzap`", "`kvzap` (a random scorer here)") + " in none of them" in TEXT

    def differs(r):
        return sorted({p for p in policies for t in ("niah1k", "niah2k") if acc(t, True, p, r)[0] != acc(t, False, p, r)[0]})

    assert differs(0.5) == ["chunkkv"] and differs(0.75) == ["chunkkv", "knorm", "tova"]
    assert "for all but `chunkkv`, `knorm` and `tova` at 0.75" in TEXT
    (m, (lo, hi)), (m2, _) = acc("niah1k", True, "chunkkv", 0.5), acc("niah1k", False, "chunkkv", 0.5)
    assert f"(niah1k: {m:.2f}, interval [{lo:.3f}, {hi:.3f}], query-aware against {m2:.2f} query-agnostic)" in TEXT
    m, (lo, hi) = acc("cnndm", True, "full", None)
    assert f"The full cache's ROUGE-2 is {m:.3f}, interval [{lo:.3f}, {hi:.3f}]" in TEXT
    clear = [k for k in by if k[0] == "cnndm" and k[2] != "full" and not (module.metric(by[k])[1][1] >= lo
                                                                          and module.metric(by[k])[1][0] <= hi)]
    assert sorted(clear) == [("cnndm", True, "window", 0.5), ("cnndm", True, "window", 0.75)]
    assert all(module.metric(by[k])[0] == 0.0 for k in clear)
    peak = {p: by[("niah2k", True, p, r)]["peak_kv_bytes"] / module.MIB for p, r in [("full", None), ("snapkv", 0.5)]}
    assert f"({peak['snapkv']:.1f} MiB at ratio 0.5 on niah2k against the full cache's {peak['full']:.1f} MiB)" in TEXT
    shares = [module.share(by, (t, a, p, 0.5), "decode_kv_bytes_mean") for t, a in NIAH for p in policies
              if p not in HELD_FULL]
    assert f"at ratio 0.5, {min(shares):.2f} to {max(shares):.2f} of the full cache's across the four niah columns" in TEXT
    held = {round(module.share(by, (t, a, p, 0.5), "decode_kv_bytes_mean"), 2) for t, a in NIAH for p in HELD_FULL}
    assert held == {1.0} and "`kvzip`, `kvzip_plus`, `kvgrad` and `duo_attention`, which held 1.00 of it" in TEXT
    agnostic_more = [module.share(by, (t, False, p, 0.5), "decode_kv_bytes_mean")
                     > module.share(by, (t, True, p, 0.5), "decode_kv_bytes_mean") for t in ("niah1k", "niah2k")
                     for p in policies if p not in HELD_FULL]
    assert all(agnostic_more)
    r = {p: by[("niah2k", True, p, 0.5 if p != "full" else None)] for p in ("kvzip", "kvgrad", "full")}
    assert (f"KVzip's prefill took {r['kvzip']['prefill_s']:.1f} s ({r['kvzip']['score_pass_s']:.1f} s of passes) and "
            f"KVgrad's {r['kvgrad']['prefill_s']:.1f} s ({r['kvgrad']['score_pass_s']:.1f} s), against the full cache's "
            f"{r['full']['prefill_s']:.1f} s") in TEXT
    prompt = {t: by[(t, True, "full", None)]["prompts"]["tokens_mean"] for t in ("niah1k", "niah2k")}
    assert f"({prompt['niah1k']:.0f} and {prompt['niah2k']:.0f} tokens of prompt" in TEXT

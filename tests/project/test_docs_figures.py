"""Every figure the docs state is recomputed here from the committed record that made it.

README.md, docs/ and results/*/README.md quote numbers a researcher will cite. Each test below reads
the committed records (runs.jsonl, the benchmarks' JSON lines with their `provenance`), recomputes the
figure the way the docs state it (same rounding), and asserts the docs say exactly that, in the
sentence or table row that states it. A number changed by hand, or a record re-made without its
prose, fails here. Report tables (`tables.md`) are regenerated from their records and compared whole.
The planner's tables depend on code (memory.py, plan.py), not on a run: one setting is planned again
here, so a change to the account that moves a documented batch size fails too.

How a check reads: `states(doc, phrase, ...)`: the phrase, whitespace-normalised, is in the doc.
"""

from __future__ import annotations

import json
import re
import statistics
from datetime import datetime, timedelta
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"


# ------------------------------------------------------------------------------------------- helpers
@cache
def text(doc: str) -> str:
    """The doc with every run of whitespace (line breaks included) as one space."""
    return " ".join((ROOT / doc).read_text().split())


def states(doc: str, *phrases: str) -> None:
    missing = [p for p in (" ".join(p.split()) for p in phrases) if p not in text(doc)]
    assert not missing, f"{doc} does not state what its record gives:\n" + "\n".join(f"  {m!r}" for m in missing)


def lines(path: str | Path) -> list[dict]:
    return [json.loads(x) for x in (ROOT / path).read_text().splitlines() if x.strip()]


def one(records: list[dict], **where) -> dict:
    """The one record whose fields (dotted keys for nested ones) equal `where`."""
    def get(r, k):
        for part in k.split("."):
            r = r.get(part) if isinstance(r, dict) else None
        return r

    found = [r for r in records if all(get(r, k.replace("__", ".")) == v for k, v in where.items())]
    assert len(found) == 1, f"{len(found)} records match {where}"
    return found[0]


def row(*cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def ci(v: float, lo_hi, sign: str = "") -> str:
    lo, hi = lo_hi
    return f"{v:{sign}.3f} [{lo:{sign}.3f}, {hi:{sign}.3f}]"


@cache
def report(folder: str):
    """kvbench-report's tables of a results folder, from its committed records and per-sample files."""
    from kvbench.report.tables import tables
    from kvbench.results import read_records

    return {t.key[1]: t for t in tables(read_records(RESULTS / folder), 0.96, RESULTS / folder)}


def run_of(table, method: str, kv=None, b=None):
    found = [r for r in table.runs if r.method == method and r.kv == kv and (b is None or r.b == b)]
    assert len(found) == 1, (method, kv, found)
    return found[0]


def minutes(records: list[dict]) -> float:
    """From the first record's start to the last one's end."""
    start = min(datetime.fromisoformat(r["started_at"]) for r in records)
    end = max(datetime.fromisoformat(r["started_at"]) + timedelta(seconds=r["wall_s"] or 0) for r in records)
    return (end - start).total_seconds() / 60


def strip_plots(md: str) -> list[str]:
    return [x for x in md.splitlines() if x.strip() and not x.startswith("![")]


# ---------------------------------------------------------------------- report tables, regenerated
@pytest.mark.parametrize("folder", ["mini", "example_cnndm", "needle_cpu", "ruler_cpu"])
def test_tables_md_is_what_kvbench_report_makes_of_the_records(folder, tmp_path):
    from kvbench.report.files import write_report

    write_report(RESULTS / folder, tmp_path, plots=False)
    assert strip_plots((tmp_path / "tables.md").read_text()) == strip_plots((RESULTS / folder / "tables.md").read_text())


# ------------------------------------------------------------------------- results/mini and README
def test_mini_reproduction_figures():
    recs = lines("results/mini/runs.jsonl")
    doc = "results/mini/README.md"
    cn, nq, gs = report("mini")["cnndm"], report("mini")["narrativeqa"], report("mini")["gsm8k"]

    def cell(t, m, kv=None, b=None):
        r = run_of(t, m, kv, b)
        return f"{r.b}, {'-' if kv is None else kv}, {ci(r.metric, r.ci)}, {r.tok_s:.1f}"

    def diff(t, m, kv):
        v = t.vs_fkv[run_of(t, m, kv).run_id].diff
        return ci(v["mean"], v["ci"], "+")

    def ratio(t, kv):
        return f"{run_of(t, 'BM', kv).tok_s / run_of(t, 'ED', 2).tok_s:.2f}"

    def ed(t):
        r, b0 = run_of(t, "ED", 2), t.first_oom(run_of(t, "ED", 2)).b
        return f"{r.b}, 2, {r.metric:.3f}, {r.tok_s:.1f} (b={b0} OOM)"

    states(doc,
           row("CNN/DM (ROUGE-2)", "mini", ed(cn), cell(cn, "FKV"), cell(cn, "BM", 1024), cell(cn, "BM", 896),
               f"{ratio(cn, 1024)}, {ratio(cn, 896)}", f"{diff(cn, 'BM', 1024)}, {diff(cn, 'BM', 896)}"),
           row("NarrativeQA (ROUGE-2)", "mini", ed(nq), cell(nq, "FKV"), cell(nq, "BM", 448), "(the same run)",
               ratio(nq, 448), diff(nq, "BM", 448)),
           row("GSM8K (accuracy)", "mini", ed(gs), cell(gs, "FKV"), cell(gs, "BM", 128), "(the same run)",
               ratio(gs, 128), diff(gs, "BM", 128)))
    assert cn.fastest([r for r in cn.runs if r.method == "BM" and r.metric >= cn.fkv.metric]).kv == 1024

    # the setting: runs, wall time per task, prompt lengths, budgets
    by_task = {t: [r for r in recs if r["task"] == t] for t in ("cnndm", "narrativeqa", "gsm8k")}
    lo = min(r["prompts"]["tokens_min"] for r in recs)
    hi = max(r["prompts"]["tokens_max"] for r in recs)
    budgets = " / ".join(f"{by_task[t][0]['config']['memory']['budget_gb']:g}" for t in by_task)
    states(doc, f"{len(recs)} runs",
           "CNN/DM {:.0f} min, NarrativeQA {:.0f}, GSM8K {:.0f} of wall time".format(*map(minutes, by_task.values())),
           f"chat prompts of {lo:,}-{hi:,} tokens", f"({budgets} GiB,")

    # the CPU reason: ED's and Batch-Max's prefill and wall time on CNN/DM
    e = one(recs, task="cnndm", policy="extreme_decode")
    b = one(recs, task="cnndm", policy="batch_max", kv_size=1024)
    states(doc, f"ED spends {e['prefill_s']:.0f} s of its {e['wall_s']:.0f} s on prefill, Batch-Max at kv=1024 "
                f"{b['prefill_s']:.0f} s of {b['wall_s']:.0f} s, so +{e['wall_s'] / b['wall_s'] - 1:.0%}")
    states(doc, f"ED on CNN/DM took {e['wall_s']:.0f} s")
    assert max(r.kv for r in nq.runs if r.method == "BM" and r.b == 24) == 576  # "24 at kv≤576 on the others"
    assert all(r.b == 24 for t in (nq, gs) for r in t.runs if r.method == "BM" and r.kv <= 576)
    states(doc, "fits 12 at kv=1024 on CNN/DM and 24 at kv≤576 on the others")
    gains = [float(ratio(nq, 448)), float(ratio(gs, 128))]
    states(doc, f"the gain is {min(gains):.1f}-{max(gains):.1f}x")

    # the accuracy paragraph
    for kv in (512, 1088):
        states(doc, f"({diff(cn, 'BM', kv)})" if kv == 512 else f"({run_of(cn, 'BM', kv).metric:.3f}) is noise ({diff(cn, 'BM', kv)})")
    widths = [max(abs(x) for x in nq.vs_fkv[r.run_id].diff["ci"]) for r in nq.runs if r.method == "BM"]
    assert all(0.04 <= w <= 0.07 for w in widths), widths  # "about +-0.05"
    states(doc, "On NarrativeQA the paired intervals are about +-0.05")
    fkv_gsm = one(recs, task="gsm8k", policy="full")
    solved = round(fkv_gsm["metrics"]["accuracy"] * fkv_gsm["n_samples"])
    one_right = sorted(r.kv for r in gs.runs if r.method == "BM" and round(r.metric * 24) == 1)
    states(doc, f"solves {solved} of 24 GSM8K problems with the full cache (Batch-Max solves 1 at kv "
                f"{one_right[0]}-{one_right[-1]}, [0, {max(run_of(gs, 'BM', k).ci[1] for k in one_right):.3f}])")

    # agreement and output lengths (the report's, from the predictions)
    agree = {t: [100 * v.agreement["prefix"] for v in tab.vs_fkv.values() if v.agreement]
             for t, tab in (("cnndm", cn), ("narrativeqa", nq))}
    states(doc, f"on CNN/DM {min(agree['cnndm']):.0f}-{max(agree['cnndm']):.0f}% of the tokens match",
           f"on NarrativeQA {min(agree['narrativeqa']):.0f}-{max(agree['narrativeqa']):.0f}%")
    L = lambda t, m, kv=None: t.lengths[run_of(t, m, kv).run_id]["mean"]  # noqa: E731
    states(doc, f"(mean {L(cn, 'BM', 128):.0f} tokens at kv=128 against FKV's {L(cn, 'FKV'):.0f})",
           f"ED's on NarrativeQA ({L(nq, 'ED', 2):.0f} against {L(nq, 'FKV'):.0f})")


def test_examples_in_results_md_and_reproducing_md():
    """docs/results.md's examples and docs/reproducing.md's summary are results/mini's figures."""
    cn, nq, gs = report("mini")["cnndm"], report("mini")["narrativeqa"], report("mini")["gsm8k"]
    fkv = cn.fkv
    states("docs/results.md", f'`"rouge2_ci": [{fkv.ci[0]:.3f}, {fkv.ci[1]:.3f}]`', f"`{ci(fkv.metric, fkv.ci)}` in every table",
           f"cannot tell {run_of(cn, 'BM', 1088).metric:.3f} from {run_of(cn, 'BM', 1024).metric:.3f}")
    assert abs(fkv.metric - 0.06) < 0.01  # "ROUGE-2 about 0.06"
    b = sorted({run_of(t, "BM", kv).b for t, kv in ((cn, 1024), (nq, 448), (gs, 128))})
    gains = [run_of(nq, "BM", 448).tok_s / run_of(nq, "ED", 2).tok_s, run_of(gs, "BM", 128).tok_s / run_of(gs, "ED", 2).tok_s]
    states("docs/reproducing.md", f"(one budget: ED and FKV fit b = {cn.fkv.b}, Batch-Max {b[0]} to {b[-1]})",
           f"{min(gains):.1f}-{max(gains):.1f}x where kv is small",
           f"the full cache solves {round(gs.fkv.metric * 24)} of the 24 problems")
    assert {run_of(t, "ED", 2).b for t in (cn, nq, gs)} == {t.fkv.b for t in (cn, nq, gs)} == {4}


def test_readme_headline():
    cn, nq, gs = report("mini")["cnndm"], report("mini")["narrativeqa"], report("mini")["gsm8k"]
    ed, fkv, bm = run_of(cn, "ED", 2), run_of(cn, "FKV"), run_of(cn, "BM", 1024)
    d = cn.vs_fkv[bm.run_id].diff
    states("README.md",
           f"(ED, kv=2) and the full cache both fit {ed.b} sequences",
           f"fits {bm.b} at kv=1024 and reaches {bm.tok_s / ed.tok_s:.1f}x ED's throughput "
           f"({bm.tok_s / fkv.tok_s:.1f}x the full cache's) with ROUGE-2 {bm.metric:.3f} against the full cache's "
           f"{fkv.metric:.3f} (paired difference {ci(d['mean'], d['ci'], '+')})",
           f"Batch-Max runs {run_of(nq, 'BM', 448).tok_s / run_of(nq, 'ED', 2).tok_s:.1f}x and "
           f"{run_of(gs, 'BM', 128).tok_s / run_of(gs, 'ED', 2).tok_s:.1f}x ED's throughput")
    widths = [max(abs(x) for x in v.diff["ci"]) for v in nq.vs_fkv.values() if v.diff]
    assert max(widths) > 0.04  # "too wide to rank"
    assert gs.fkv.metric == 0.0  # "the full cache solves none of them: parity there is vacuous"
    states("README.md", "solves 0 of the 24 problems with the full cache")


def test_example_cnndm_table():
    t = report("example_cnndm")["cnndm"]
    fkv = t.fkv
    doc = "results/example_cnndm/README.md"

    def lengths(r):
        ln = t.lengths[r.run_id]
        return f"{ln['mean']:.1f} / {ln['median']:g} / {ln['max']}"

    states(doc, row("FKV", "-", ci(fkv.metric, fkv.ci), "", lengths(fkv)))
    for m, kv in (("BM", 128), ("BM", 256), ("Window", 128), ("Window", 256)):
        r = run_of(t, m, kv)
        d = t.vs_fkv[r.run_id].diff
        states(doc, row(m, kv, ci(r.metric, r.ci), ci(d["mean"], d["ci"], "+"), lengths(r)))
    states(doc, f"FKV's own interval spans {fkv.ci[0]:.2f} to {fkv.ci[1]:.2f}",
           f"after {t.lengths[run_of(t, 'Window', 128).run_id]['median']:g} tokens at the median, against "
           f"{t.lengths[fkv.run_id]['median']:g} for FKV")


# ------------------------------------------------------------------------------------------ planner
PLAN_NAMES = {"paper_llama2_cnndm": "Llama-2 CNN/DM", "paper_llama2_narrativeqa": "Llama-2 NarrativeQA",
              "paper_llama2_gsm8k": "Llama-2 GSM8K (2 GPUs)", "paper_phi35_cnndm": "Phi-3.5 CNN/DM",
              "paper_phi35_narrativeqa": "Phi-3.5 NarrativeQA", "paper_phi35_gsm8k": "Phi-3.5 GSM8K"}


def plan_rows(line: dict) -> list[str]:
    """results/plan/README.md's rows of one setting, from its plan_vs_paper.jsonl line."""
    conds = ["eager", "eager, first block in chunks of p", "sdpa", "eager, reserve 1.5 GiB"]
    pair = lambda v: f"{v[0]} / {v[1]}"  # noqa: E731
    (b, b0), fkv, bm = line["paper"]["ED"], line["paper"]["FKV"], line["paper"]["BM"]
    out = [row(PLAN_NAMES[line["setting"]], "ED (kv 2)", f"{b} / {b0}", *(pair(line[c]["ED"]) for c in conds)),
           row("", "FKV", fkv, *(pair(line[c]["FKV"]) for c in conds))]
    out += [row("", f"BM kv {kv}", pb, *(pair(line[c]["BM"][str(kv)]) for c in conds)) for pb, kv in bm]
    return out


def test_plan_vs_paper_table_is_its_record():
    recs = lines("results/plan/plan_vs_paper.jsonl")
    assert [r["setting"] for r in recs] == list(PLAN_NAMES)
    for r in recs:
        states("results/plan/README.md", *plan_rows(r))
    lo = max(r["eager_reserve_gb_interval"][0] for r in recs)
    hi = min(r["eager_reserve_gb_interval"][1] for r in recs)
    prov = recs[-1]["provenance"]
    states("results/plan/README.md", f"any reserve in ({lo}, {hi}] GiB", f"some term must be larger by more than {lo} GiB",
           f"(about {prov['wall_s']:.0f} s here, load average {prov['load_avg_1m_before']:.1f}",
           f"at commit {prov['commit'][:7]}")
    by = {r["setting"]: r for r in recs}
    sdpa_gain = [by[k]["sdpa"]["ED"][0] / by[k]["paper"]["ED"][0] for k in by]
    ll, phi = by["paper_llama2_cnndm"], by["paper_phi35_cnndm"]
    states("results/plan/README.md", f"ED would fit {min(sdpa_gain):.0f}-{max(sdpa_gain):.0f}x the paper's batch "
           f"({ll['sdpa']['ED'][0]} instead of {ll['paper']['ED'][0]} on Llama-2, {phi['sdpa']['ED'][0]} instead of "
           f"{phi['paper']['ED'][0]} on Phi-3.5)")
    exact = sum(r["eager"]["ED"] == r["paper"]["ED"] for r in recs)
    states("results/plan/README.md", f"ED's b and b0 exactly for {['no', 'one', 'two', 'three', 'four', 'five', 'six'][exact]} "
                                     "of the six settings")
    first = [(by[k]["eager"]["BM"][str(kv)][0], by[k]["eager, first block in chunks of p"]["BM"][str(kv)][0])
             for k, kv in (("paper_llama2_cnndm", 1024), ("paper_llama2_narrativeqa", 1792), ("paper_phi35_cnndm", 2176))]
    states("results/plan/README.md", "cap Batch-Max at {} (kv 1024), {} (kv 1792), {} (Phi-3.5, kv 2176)".format(*(a for a, _ in first)),
           "multiplies Batch-Max's batch by {:.0f}-{:.0f} under eager ({}, {}, {})".format(
               min(b / a for a, b in first), max(b / a for a, b in first), *(b for _, b in first)))
    # the b = 5 peak of ED on Llama-2 CNN/DM against the per-GPU memory, from the plan record
    plan = one(lines("results/plan/runs.jsonl"), experiment="paper_llama2_cnndm", config__plan__backends=["eager"],
               config__memory__reserve_gb=0.0, config__gen__prefill_chunk=4096)
    ed = next(x for x in plan["plan"]["rows"] if x["method"] == "ED")
    gib = 32510 / 1024
    states("results/plan/README.md", f"accounted peak is {ed['peak_bytes'] / 2**30:.2f} GiB of {gib:.2f}",
           f"5 x 40 x 3584² x 2 bytes = {5 * 40 * 3584**2 * 2 / 2**30:.1f} GiB")


def test_memory_md_plan_printout_is_todays_plan(tmp_path):
    """docs/memory.md's kvbench-plan printout, planned again with today's account (no weights, seconds)."""
    from hydra import compose, initialize_config_dir

    from kvbench import capacity
    from kvbench.config import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="docs_figures"):
        cfg = compose("config", overrides=["experiment=paper_llama2_cnndm", f"results_dir={tmp_path}"])
    record = capacity.plan(cfg)
    printed = [x for x in capacity.table(record).splitlines() if x.strip()]
    states("docs/memory.md", *printed)
    # and the committed plan_vs_paper record of the same setting says the same batch sizes
    line = one(lines("results/plan/plan_vs_paper.jsonl"), setting="paper_llama2_cnndm")
    got = {(r["attention"], r["method"], r["kv_size"]): [r["max_batch_size"], r["first_oom_batch_size"]]
           for r in record["plan"]["rows"]}
    for backend in ("eager", "sdpa"):
        assert got[(backend, "ED", 2)] == line[backend]["ED"] and got[(backend, "FKV", None)] == line[backend]["FKV"]
        assert all(got[(backend, "BM", int(kv))] == v for kv, v in line[backend]["BM"].items())


@pytest.mark.slow
def test_plan_vs_paper_record_is_todays_plan(tmp_path):
    """All six settings planned again (about a minute): the committed record still holds for today's code."""
    import subprocess
    import sys

    subprocess.run([sys.executable, str(ROOT / "scripts" / "plan_vs_paper.py"), "--out", str(tmp_path)], check=True,
                   capture_output=True)
    strip = lambda rs: [{k: v for k, v in r.items() if k != "provenance"} for r in rs]  # noqa: E731
    assert strip(lines(tmp_path / "plan_vs_paper.jsonl")) == strip(lines("results/plan/plan_vs_paper.jsonl"))


# ------------------------------------------------------------------------------------ docs/memory.md
def test_memory_md_max_batch_example():
    recs = lines("results/max_batch_cnndm/runs.jsonl")
    doc = "docs/memory.md"
    ed, fkv, bm = (one(recs, policy=p) for p in ("extreme_decode", "full", "batch_max"))
    for r in (ed, fkv, bm):
        assert r["n_samples"] == 48 and r["search"]["decided_by"] == "accounted" and r["git_sha"].startswith("581bd7d")
        states(doc, row(r["policy"], r["kv_size"] or "-", r["search"]["max_batch_size"], r["search"]["first_oom_batch_size"],
                        f"{r['accounted_mem_bytes'] / 2**30:.3f} GiB"))
    p = bm["prompts"]
    states(doc, f"the first {p['n']} CNN/DM 1-shot prompts from the CNN/DM mirror, {p['tokens_min']:,} to {p['tokens_max']:,} tokens",
           f"commit {bm['git_sha'][:7]}",
           f"Batch-Max fits {bm['search']['max_batch_size'] // ed['search']['max_batch_size']}x the batch",
           f"b0 of {bm['search']['first_oom_batch_size']} is a verdict of the budget",
           "Each search took {:.0f}-{:.0f} s".format(min(r["search"]["wall_s"] for r in recs),
                                                     max(r["search"]["wall_s"] for r in recs)))
    assert bm["search"]["first_oom_batch_size"] < bm["n_samples"]  # the budget, not the sample count, stops it
    s = [r["plan"]["seconds"] for r in lines("results/plan/runs.jsonl")]
    states(doc, f"took {min(s)} to {max(s)} s here (`plan.seconds`)")


# --------------------------------------------------------------------------------------- serve mode
LABEL = {"window": "window (4 sinks)", "h2o": "h2o", "full": "full", "batch_max": "batch_max"}


def test_goodput_figures():
    recs = lines("results/serve/goodput/runs.jsonl")
    g = {(r["policy"], r["config"]["serve"]["rate"]): r for r in recs}
    for pol, rate in (("full", 0.5), ("full", 2.0), ("window", 2.0), ("batch_max", 2.0), ("h2o", 1.0), ("h2o", 2.0)):
        s = g[(pol, rate)]["serve"]
        states("docs/serving.md", row(LABEL[pol], f"{rate:g}", f"{s['goodput_rps']:.3f}", f"{s['slo_attained']:.0%}",
                                      f"{s['ttft_s']['p90']:.1f}", s["preemptions"],
                                      f"{g[(pol, rate)]['peak_kv_bytes'] / 2**20:.1f}"))
    full = [g[("full", r)]["serve"] for r in (0.5, 1.0, 2.0)]
    pre = [s["preemptions"] for s in full]
    rec = [s["recomputed_tokens"] for s in full]
    good = [s["goodput_rps"] for s in full]
    assert [r for (p, r), x in g.items() if p == "full" and x["serve"]["slo_attained"] == 1.0] == [0.25]
    assert {s["running_max"] for s in full} == {3}
    evicting = max(g[(p, 2.0)]["serve"]["running_max"] for p in ("window", "batch_max"))
    assert all(g[(p, r)]["serve"]["preemptions"] == 0 and g[(p, r)]["serve"]["slo_attained"] == 1.0
               for p in ("window", "batch_max") for r in (0.25, 0.5, 1.0, 2.0))
    starts = sorted(r["started_at"] for r in recs)
    for doc in ("docs/serving.md", "results/serve/README.md"):
        states(doc, f"{min(pre)}-{max(pre)} preemptions", f"run up to {evicting} at once",
               f"{starts[0][:10]} {starts[0][11:16]}-{starts[-1][11:16]} UTC", f"at commit {recs[0]['git_sha'][:7]}")
    h = g[("h2o", 2.0)]["serve"]
    states("results/serve/README.md",
           f"{round(min(rec), -3):,}-{round(max(rec), -3):,} prompt tokens recomputed",
           f"goodput falls to {min(good):.2f}-{max(good):.2f} requests/s",
           f"(goodput {g[('window', 2.0)]['serve']['goodput_rps']:.2f} and {g[('batch_max', 2.0)]['serve']['goodput_rps']:.2f})",
           f"falls to {h['goodput_rps']:.2f} at 2 ({h['preemptions']} preemptions)",
           f"`goodput/runs.jsonl` the {len(recs)} records")


def test_bench_serve_table():
    line = lines("results/serve/bench_serve.jsonl")[-1]
    pct = lambda x: f"{100 * x:.0f}%"  # noqa: E731
    for n, v in line["n"].items():
        s = v["split"]
        states("docs/serving.md", row(n, f"{v['static_tok_s']:.1f}", f"{v['serve_tok_s']:.1f}", f"**{v['ratio']:.2f}**",
                                      "yes" if v["same_tokens"] else "no"),
               row(n, *map(pct, (s[k] for k in ("linear", "attention", "model_rest", "kv_io", "loop"))),
                   pct(v["outside_linear_and_attention"]), f"{100 * v['serving_overhead']:.1f}%"))
    n = line["n"]
    rest = [v["static_split"]["model_rest"] for v in n.values()]
    states("docs/serving.md",
           f"Serve mode is {n['8']['ratio']:.2f}x the static engine at 8 requests and {n['32']['ratio']:.2f}x at 32",
           f"{n['1']['ratio']:.2f}x at a single request, where its page writes and gathers (`kv_io`, "
           f"{pct(n['1']['split']['kv_io'])})",
           f"which are {pct(min(rest))[:-1]}-{pct(max(rest))} of the static engine's step")


def test_serve_compare_table():
    recs = {r["policy"]: r for r in lines("results/serve/runs.jsonl")}
    for pol, r in recs.items():
        s = r["serve"]
        name = {"window": "window (4 sinks)", "h2o": "h2o (decode_only)"}.get(pol, pol)
        states("results/serve/README.md", row(name, s["steps"], s["preemptions"], s["recomputed_tokens"],
                                              f"{s['running_mean']:.1f} / {s['running_max']}", f"{s['output_tok_s']:.2f}",
                                              f"{s['ttft_s']['p50']:.0f}", f"{r['metrics']['rouge2']:.3f}"))
    full, ev = recs["full"]["serve"], [recs[p]["serve"] for p in ("window", "batch_max", "h2o")]
    tps = [s["output_tok_s"] for s in ev]
    assert {s["steps"] for s in ev} == {ev[0]["steps"]}
    states("results/serve/README.md", f"{full['steps'] / ev[0]['steps']:.2f}x as many forwards ({full['steps']} steps against "
                                      f"{ev[0]['steps']}; its {full['preemptions']} preemptions recompute "
                                      f"{full['recomputed_tokens']} prompt tokens)",
           f"({min(tps):.2f}-{max(tps):.2f} against full's {full['output_tok_s']:.2f})",
           f"differ by {max(tps) / min(tps):.1f}x among themselves")
    states("docs/serving.md", f"full runs about {full['running_mean']:.0f} requests at once and preempts "
                              f"{full['preemptions']} times; the evicting policies run up to {max(s['running_max'] for s in ev)}")


# ------------------------------------------------------------------------------- results/README.md
def test_results_readme_benchmarks():
    doc = "results/README.md"
    ed = lines("results/bench_eviction_ed.jsonl")[-1]
    states(doc, f"load average {ed['load_avg_1m_before']:.1f} before",
           f"decoded **{ed['extreme_decode_decode_tok_s']:.1f} tokens/s** against the full cache's "
           f"**{ed['full_decode_tok_s']:.1f}** (over 1,024+ pairs), {ed['ed_vs_full_decode']:.2f}x (`ed_at_least_full: "
           f"{str(ed['ed_at_least_full']).lower()}`)",
           f"{ed['extreme_decode_evict_s']:.3f} s in all, {ed['extreme_decode_evict_share']:.1%} of its decode time",
           f"spent {ed['extreme_decode_generic_evict_s']:.3f} s ({ed['extreme_decode_generic_evict_share']:.1%}) and decoded "
           f"{ed['extreme_decode_generic_decode_tok_s']:.1f} tokens/s")
    a = lines("results/bench_eviction_attention.jsonl")[-1]
    states(doc, f"load average {a['load_avg_1m_before']:.0f}-{a['load_avg_1m_after']:.0f} on 2 cores",
           row("prefill s", f"{a['full_prefill_s']:.2f}", f"{a['window_prefill_s']:.2f}",
               f"{a['batch_max_prefill_s']:.2f} (**{a['prefill_vs_window']:.3f}x window**)",
               f"{a['batch_max_sdpa_prefill_s']:.2f} ({a['sdpa_prefill_vs_window']:.3f}x window)"),
           row(f"decode tokens/s ({a['new_tokens'] - 1} steps)", f"{a['full_decode_tok_s']:.2f}",
               f"{a['window_decode_tok_s']:.2f}", f"{a['batch_max_decode_tok_s']:.2f} ({a['speedup']:.2f}x full)",
               f"{a['batch_max_sdpa_decode_tok_s']:.2f}"),
           f"`targets_met: {str(a['targets_met']).lower()}`",
           f"`tokens_equal_across_backends: {str(a['tokens_equal_across_backends']).lower()}`",
           f"is the comparable figure: {a['overhead_share_vs_window']:.1%} here")
    pts = lines("results/throughput_vs_batch.jsonl")
    by = {(p["policy"], p["batch_size"]): p for p in pts}
    for b in (1, 2, 4, 8, 16):
        f, m = by[("full", b)], by[("batch_max", b)]
        states(doc, row(b, f"{f['throughput_tok_s']:.2f}", f"{f['prefill_s']:.0f} / {f['decode_s']:.0f}",
                        f"{m['throughput_tok_s']:.2f}", f"{m['prefill_s']:.0f} / {m['decode_s']:.0f}"))
    full_tps = [by[("full", b)]["throughput_tok_s"] for b in (1, 2, 4, 8, 16)]
    bm_pre = [by[("batch_max", b)]["prefill_s"] for b in (1, 2, 4, 8, 16)]
    assert 7 <= min(full_tps) and max(full_tps) < 9 and all(90 <= x <= 115 for x in bm_pre)  # "7-8 tok/s", "about 100 s"
    start = min(datetime.strptime(p["run_id"][:15], "%Y%m%d-%H%M%S") for p in pts)
    end = max(datetime.strptime(p["run_id"][:15], "%Y%m%d-%H%M%S") + timedelta(seconds=p["wall_s"]) for p in pts)
    assert abs((end - start).total_seconds() / 60 - 50) < 2.5  # "about 50 minutes"
    states(doc, f"{pts[0]['n_samples']} samples of {statistics.mean(p['prompt_tokens_mean'] for p in pts):,.0f} tokens on average",
           "about 50 minutes from the first point's start",
           f"{by[('batch_max', 16)]['throughput_tok_s'] / by[('full', 16)]['throughput_tok_s']:.1f}x the full cache's "
           "throughput at batch 16")
    (kv,), sizes = {p["kv_size"] for p in pts if p["policy"] == "batch_max"}, [p["batch_size"] for p in pts]
    states("docs/benchmarks.md", f"Batch-Max (kv {kv}) at batch {min(sizes)} to {max(sizes)}",
           f"{pts[0]['n_samples']} CNN/DM 1-shot prompts ({statistics.mean(p['prompt_tokens_mean'] for p in pts):,.0f} "
           f"tokens on average), {pts[0]['max_new_tokens']} new tokens")


def test_mini_eager_max_batch_table():
    doc = "results/mini_eager/README.md"
    recs = [r for r in lines("results/mini_eager/runs.jsonl") if r.get("search")]
    cell = {}
    for r in recs:
        key = ({"extreme_decode": "ED", "full": "FKV", "batch_max": "BM"}[r["policy"]], r["kv_size"])
        col = (r["attention"], r["config"]["gen"]["prefill_chunk"])
        s = r["search"]
        cell[key, col] = f"{s['max_batch_size']} / {s['first_oom_batch_size'] or '-'}"
    cols = [("sdpa", None), ("sdpa", 4096), ("eager", None), ("eager", 4096)]
    for key in (("ED", 2), ("FKV", None), ("BM", 512), ("BM", 896), ("BM", 1024)):
        states(doc, row(key[0], key[1] or "-", *(cell[key, c] for c in cols)))
    assert all(cell[("BM", kv), c] == "24 / -" for kv in (128, 256) for c in cols)  # "fit all 24 samples everywhere"
    check = lines("results/mini_eager/max_batch.jsonl")[-1]
    assert check["same_as_plan"] and len(check["searched"]) == len(recs) == 28
    states(doc, f"{len(recs)} searches", f"kvbench-plan predicts all {len(recs)} of them exactly")
    starts = sorted(datetime.fromisoformat(r["started_at"]) for r in recs)
    assert round((starts[-1] - starts[0]).total_seconds() / 60) == 10
    p = recs[0]["prompts"]
    states(doc, f"({p['n']} prompts of {p['tokens_min']:,}-{p['tokens_max']:,} tokens)",
           f"9 x {p['tokens_max']}² float32 probabilities per sample ({9 * p['tokens_max']**2 * 4 / 2**30:.2f} GiB")


# ------------------------------------------------------------------------------------------ the demo
def test_demo_table_and_prose():
    from kvbench.demo import setting, table

    recs = lines("results/demo/runs.jsonl")
    doc = "results/demo/README.md"
    states(doc, setting(recs), *[x for x in table(recs).splitlines() if x.strip()])
    (p,) = {json.dumps(r["prompts"]) for r in recs}
    p = json.loads(p)
    assert p["tokens_min"] == p["tokens_max"]
    (new,) = {r["max_new_tokens"] for r in recs}
    by = {(r["policy"], r["kv_size"]): r for r in recs}
    fkv, ed, bm, bm_small = by["full", None], by["extreme_decode", 2], by["batch_max", 512], by["batch_max", 256]
    tput = {k: r["throughput_tok_s"] for k, r in by.items()}
    found = {k: round(r["metrics"]["accuracy"] * r["n_samples"]) for k, r in by.items()}
    n = p["n"]
    for d in ("README.md", "docs/getting-started.md", doc):
        states(d, f"({n} prompts of {p['tokens_min']} tokens")
    states("docs/policies.md", f"per-token eviction in the demo's {p['tokens_min']}-token prefill is slow")
    states("docs/getting-started.md", f"{new} new tokens each with EOS ignored",
           f"fits {fkv['config']['memory']['limit_gb']} GiB")
    states("README.md", f"{n} prompts of {p['tokens_min']} tokens, {new} new tokens each",
           f"Batch-Max at kv=512 fit {bm['batch_size']} prompts where the full cache and ED fit {fkv['batch_size']}",
           f"ran {tput['batch_max', 512] / tput['full', None]:.2f}x the full cache's tokens/s finding every key",
           f"at kv=256 it fit {bm_small['batch_size']} and ran {tput['batch_max', 256] / tput['full', None]:.2f}x, "
           f"but found {found['batch_max', 256]} of {n} keys")
    assert ed["batch_size"] == fkv["batch_size"] and found["batch_max", 512] == found["full", None] == n
    assert {r["search"]["first_oom_batch_size"] for r in (fkv, ed)} == {6}
    assert bm_small["batch_size"] == n and bm_small["search"]["first_oom_batch_size"] is None
    hits = {k: [json.loads(x)["score"]["accuracy"] for x in (ROOT / r["scores_path"]).read_text().splitlines()]
            for k, r in by.items()}
    latest = [i for i, v in enumerate(hits["batch_max", 256]) if v]  # passkey: sample i's key at 0.1 + 0.8 i / (n - 1)
    assert latest == list(range(n - len(latest), n)) and hits["streaming_llm", 256] == hits["batch_max", 256]
    depth = 0.1 + 0.8 * latest[0] / (n - 1)
    states(doc, f"The full cache and ED both fit {fkv['batch_size']} prompts, not 6",
           f"(peak KV {ed['peak_kv_bytes'] / 2**20:.1f} MB against {fkv['peak_kv_bytes'] / 2**20:.1f} MB)",
           f"Batch-Max at kv=512 fits {bm['batch_size']}, at kv=256 {bm_small['batch_size']} (all the prompts",
           f"Batch-Max at kv=512 runs {tput['batch_max', 512] / tput['full', None]:.2f}x the full cache's tokens/s and "
           f"{tput['batch_max', 512] / tput['extreme_decode', 2]:.2f}x ED's",
           f"every key the full cache finds ({n} of {n})",
           f"kv=256 it runs {tput['batch_max', 256] / tput['full', None]:.2f}x the full cache's tokens/s, but finds "
           f"{found['batch_max', 256]} of {n} keys",
           f"at 256 pairs of the {p['tokens_max'] + new} the full cache holds Batch-Max finds only the "
           f"{len(latest)} keys placed latest (depths {depth:.2f} to 0.90)",
           f"TOVA, under the same schedule and budget, finds {found['tova', 256]}, H2O {found['h2o', 256]}",
           "TOVA's {:.3f} has the interval [{:.3f}, {:.3f}]".format(by["tova", 256]["metrics"]["accuracy"],
                                                                   *by["tova", 256]["metrics"]["accuracy_ci"]),
           f"its {len(recs)} runs took {sum(r['wall_s'] for r in recs):.0f} s in all")


# -------------------------------------------------------------------------------------- cross-check
def test_crosscheck_table_and_prose():
    s = json.loads((RESULTS / "crosscheck" / "summary.json").read_text())
    rows = {(r["press"], r["kvbench"], r["ratio"]): r for r in s["rows"]}
    for r in s["rows"]:
        extra = r["rows_identical_or_ties"] - r["identical_rows"]
        states("results/crosscheck/table.md", (
            f"| {r['press']} | {r['kvbench']} | {'-' if r['press'] == 'none' else format(r['ratio'], 'g')} | "
            f"{r['identical_rows']}/{r['rows']}{f' (+{extra} at ties)' if extra else ''} | {r['mean_common_prefix']:.3f} | "
            f"{r['identical_sets']}/{r['sets']} | {r['jaccard_mean']:.4f} / {r['jaccard_min']:.4f} | "
            f"{r['rouge2_kvbench']:.4f} / {r['rouge2_kvpress']:.4f} |"))
    lens = s["prompt_tokens"]
    frac = lambda k: "{identical_rows}/{rows}".format(**rows[k])  # noqa: E731
    same_rule = [k for k in rows if k[0] != "none" and k[2] == 0.5 and " " not in k[1] and k[1] != "h2o"]
    assert all(rows[k]["identical_rows"] == rows[k]["rows"] == 16 for k in same_rule)
    short = sorted({int(i) for k in (("snapkv", "snapkv", 0.75), ("pyramidkv", "pyramidkv", 0.75))
                     for i in rows[k]["diverged_rows"]})
    budgets = [int(lens[i] * 0.25) for i in short]
    tova = rows[("tova", "tova", 0.75)]
    for doc in ("results/crosscheck/README.md", "docs/crosscheck.md"):
        states(doc, f"({min(lens)}-{max(lens):,} prompt tokens" if doc.startswith("results") else
               f"({min(lens)}-{max(lens):,} prompt tokens)")
    states("results/crosscheck/README.md",
           f"Knorm {frac(('knorm', 'knorm', 0.75))} (row {next(iter(rows[('knorm', 'knorm', 0.75)]['diverged_rows']))}:",
           f"TOVA {frac(('tova', 'tova', 0.75))}", f"`policy.protect_recent=1` gives {frac(('tova', 'tova protect_recent=1', 0.75))}",
           f"SnapKV and PyramidKV {frac(('snapkv', 'snapkv', 0.75))} (rows {short[0]} and {short[1]}: prompts of "
           f"{lens[short[0]]} and {lens[short[1]]} tokens, so budgets of {budgets[0]} and {budgets[1]} under the 64-pair window",
           f"(kept-set Jaccard {rows[('observed_attention', 'h2o', 0.5)]['jaccard_mean']:.2f} at 0.5, "
           f"{rows[('observed_attention', 'h2o', 0.75)]['jaccard_mean']:.2f} at 0.75)")
    states("README.md", f"same tokens as kvpress 0.5.5 on 16 of {len(lens)} CNN/DM prompts at compression 0.5")
    states("docs/policies.md", f"their kept sets have a Jaccard of {rows[('observed_attention', 'h2o', 0.5)]['jaccard_mean']:.2f} "
                               f"at compression 0.5 and {rows[('observed_attention', 'h2o', 0.75)]['jaccard_mean']:.2f} at 0.75")
    states("docs/crosscheck.md",
           f"These prompts have {lens[short[0]]} and {lens[short[1]]} tokens, so the budget is {budgets[0]} and {budgets[1]} pairs",
           f"a Jaccard of {rows[('observed_attention', 'h2o', 0.5)]['jaccard_mean']:.2f} at 0.5 and "
           f"{rows[('observed_attention', 'h2o', 0.75)]['jaccard_mean']:.2f} at 0.75",
           f"({tova['sets'] - tova['identical_sets']} of {tova['sets']:,} sets differ)",
           f"PyramidKV: {frac(('pyramidkv', 'pyramidkv budget_rule=window_plus', 0.5))} identical rows before, "
           f"{frac(('pyramidkv', 'pyramidkv', 0.5))} after at 0.5")


@cache
def crosscheck(folder: str) -> dict[tuple[str, float], dict]:
    """A committed cross-check folder's rows (compare.py's summary.json), by (kvpress press, ratio)."""
    rows = json.loads((RESULTS / "crosscheck" / folder / "summary.json").read_text())["rows"]
    return {(r["press"], r["ratio"]): r for r in rows}


def agreement(r: dict, sep: str = " and") -> str:
    """A row's agreement as the docs state it; sep "," as the folders' READMEs write it."""
    return (f"identical tokens on {r['identical_rows']} of {r['rows']} rows{sep} identical kept sets in "
            f"{r['identical_sets']} of {r['sets']}")


def test_crosscheck_of_lagkv_and_chunkkv():
    rows = crosscheck("keys")
    chunk, lag = rows[("chunkkv", 0.5)], rows[("lagkv", 0.5)]
    tied = sorted(map(int, lag["diverged_rows"]))
    assert set(lag["diverged_rows"].values()) == {"ties"}
    assert lag["rows_identical_or_ties"] == lag["rows"] == chunk["identical_rows"] == 16
    states("docs/crosscheck.md", f"{agreement(chunk)}; LagKV on {lag['identical_rows']} of {lag['rows']}, the other "
                                 f"{lag['rows'] - lag['identical_rows']}")
    states("results/crosscheck/keys/README.md", agreement(chunk, ","),
           f"identical tokens on {lag['identical_rows']} of {lag['rows']} rows; rows "
           f"{', '.join(map(str, tied[:-1]))} and {tied[-1]} differ")


def test_crosscheck_of_the_observe_step_policies():
    rows = crosscheck("observe")
    ea, ada, zap = (rows[(p, 0.5)] for p in ("expected_attention", "adakv_expected_attention", "kvzap_mlp_head"))
    assert all(r["identical_rows"] == r["rows"] == 16 for r in (ea, ada, zap))
    states("docs/crosscheck.md",
           f"ExpectedAttention gives {agreement(ea)}; AdaKV over ExpectedAttention (the leaderboard's epsilon "
           f"0.01) {ada['identical_rows']} of {ada['rows']} and {ada['identical_sets']} of {ada['sets']}; KVzap (the "
           f"same random MLP scorer on both sides) {zap['identical_rows']} of {zap['rows']} and {zap['identical_sets']} "
           f"of {zap['sets']}")
    states("results/crosscheck/observe/README.md", f"ExpectedAttention: {agreement(ea, ',')}",
           f"AdaKV over ExpectedAttention: {agreement(ada, ',')}",
           f"KVzap: {agreement(zap, ',')}; each of the {zap['sets'] - zap['identical_sets']} sets")


def test_crosscheck_of_criticalkv():
    rows = crosscheck("critical")
    r, ea = rows[("critical_snapkv", 0.5)], rows[("critical_expected_attention", 0.5)]
    assert all(x["identical_rows"] == x["rows"] == 16 for x in (r, ea))
    states("docs/crosscheck.md", f"over ExpectedAttention (`use_vnorm` off, kvpress's row) {agreement(ea)}; over "
                                 f"SnapKV {agreement(r)} ([results/crosscheck/critical]")
    states("results/crosscheck/critical/README.md", f"over ExpectedAttention: {agreement(ea, ',')}",
           f"over SnapKV: {agreement(r, ',')}.")
    short = sorted(json.loads((RESULTS / "crosscheck" / "critical" / "summary.json").read_text())["prompt_tokens"])[:2]
    first = [int(0.5 * n * 0.5) for n in short]  # the two shortest prompts' first stage
    states("docs/crosscheck.md", f"their first stage ({first[0]} and {first[1]} pairs) holds fewer pairs than the "
                                 "64-pair window")
    states("results/crosscheck/critical/README.md", f"the two shortest prompts ({short[1]} and {short[0]} tokens)",
           f"int(0.5 x n x 0.5) = {first[1]} and {first[0]} pairs per head")


@pytest.mark.parametrize(("folder", "name"), [("kvzip", "KVzip"), ("kvzip_plus", "KVzip+")])
def test_crosscheck_of_kvzip(folder, name):
    (r,) = crosscheck(folder).values()
    assert (r["press"], r["ratio"], r["identical_rows"], r["rows"]) == (folder, 0.5, 16, 16)
    states("docs/crosscheck.md", f"**{name}**, at compression 0.5 on the same 16 prompts", agreement(r) +
           f" ([results/crosscheck/{folder}](../results/crosscheck/{folder}/README.md)")
    states(f"results/crosscheck/{folder}/README.md", agreement(r, ","))


def test_crosscheck_of_kvgrad():
    rows = crosscheck("kvgrad")
    assert sorted(rows) == [("kvgrad", 0.25), ("kvgrad", 0.5), ("kvgrad", 0.75)]
    assert all(r["identical_rows"] >= 15 for r in rows.values())
    at = {ratio: r for (_, ratio), r in rows.items()}
    states("docs/crosscheck.md", f"**KVgrad**, on the same 16 prompts: at compression 0.5 {agreement(at[0.5])}; at 0.25 "
                                 f"{agreement(at[0.25])}; at 0.75 {agreement(at[0.75])}")
    states("results/crosscheck/kvgrad/README.md", *(f"at {ratio}, {agreement(r, ',')}" for ratio, r in at.items()))


def test_crosscheck_of_kvzap_by_threshold():
    rows = {r["ratio"]: r for r in json.loads((RESULTS / "crosscheck" / "dms" / "summary.json").read_text())["rows"]}
    assert sorted(rows) == [-5.5, -5.0, -4.5] and all(r["press"] == "kvzap_mlp" for r in rows.values())
    assert rows[-5.0]["identical_rows"] >= 15
    pair = {t: f"{r['identical_rows']} of {r['rows']}" for t, r in rows.items()}
    sets = {t: f"{r['identical_sets']} of {r['sets']}" for t, r in rows.items()}
    states("docs/crosscheck.md", f"at threshold -5.0 identical tokens on {pair[-5.0]} rows and identical kept sets in "
                                 f"{sets[-5.0]}; at -5.5 {pair[-5.5]} and {sets[-5.5]}; at -4.5 {pair[-4.5]} and "
                                 f"{sets[-4.5]}")
    states("results/crosscheck/dms/README.md", *(f"threshold {t:.1f}: identical tokens on {pair[t]} rows, identical kept "
                                                f"sets in {sets[t]}" for t in rows))


def test_crosscheck_of_duo_attention():
    rows = crosscheck("duo")
    assert set(rows) == {("duo_attention_on_the_fly", r) for r in (0.25, 0.5, 0.75)}
    few, half, most = (rows[("duo_attention_on_the_fly", r)] for r in (0.25, 0.5, 0.75))
    assert half["identical_rows"] == half["rows"] == 16
    states("docs/crosscheck.md", f"at a share of 0.5 streaming heads {agreement(half)}; at 0.75 {agreement(most)}; "
                                 f"at 0.25 {agreement(few)}")
    states("results/crosscheck/duo/README.md", f"at 0.5, {agreement(half, ',')} (layer, KV head, row); at 0.75, "
                                               f"{agreement(most, ',')}; at 0.25", f"output made earlier by the same "
                                               f"script), {agreement(few, ',')}.")


def test_crosscheck_of_adakv_over_compactor():
    rows = crosscheck("adakv_compactor")
    assert sorted(rows) == [("adakv_compactor", r) for r in (0.25, 0.5, 0.75)]
    assert rows[("adakv_compactor", 0.5)]["identical_rows"] >= 15
    at = {ratio: r for (_, ratio), r in rows.items()}
    states("docs/crosscheck.md", f"on the same 16 prompts: at compression 0.5 {agreement(at[0.5])}; at 0.25 "
                                 f"{agreement(at[0.25])}; at 0.75 {agreement(at[0.75])} ([results/crosscheck/adakv_compactor]")
    states("results/crosscheck/adakv_compactor/README.md",
           *(f"at {ratio}, {agreement(at[ratio], ',')}" for ratio in (0.5, 0.25, 0.75)))


def test_crosscheck_at_compression_0_25():
    rows, doc, readme = crosscheck("ratios"), "docs/crosscheck.md", "results/crosscheck/ratios/README.md"
    same = [rows[(p, 0.25)] for p in ("expected_attention", "adakv_expected_attention", "critical_expected_attention",
                                      "critical_snapkv", "chunkkv", "kvzip", "kvzip_plus")]
    assert all(r["identical_rows"] == r["rows"] and r["identical_sets"] == r["sets"] for r in same)
    states(doc, f"ChunkKV, KVzip and KVzip+: identical tokens on {same[0]['identical_rows']} of {same[0]['rows']} rows and "
                f"identical kept sets in {same[0]['identical_sets']} of {same[0]['sets']} each")
    states(readme, f"ChunkKV, KVzip and KVzip+: {agreement(same[0], ',')} each")
    zap, lag = rows[("kvzap_mlp_head", 0.25)], rows[("lagkv", 0.25)]
    assert zap["rows_identical_or_ties"] == lag["rows_identical_or_ties"] == 16  # every diverging row: at ties
    states(doc, f"KVzap {zap['identical_rows']} of {zap['rows']} rows, LagKV {lag['identical_rows']} of {lag['rows']},")
    states(readme, f"KVzap at 0.25: {agreement(zap, ',')}; each of the {zap['sets'] - zap['identical_sets']} sets",
           f"LagKV at 0.25: identical tokens on {lag['identical_rows']} of {lag['rows']} rows;")
    assert list(zap["diverged_rows"]) == ["0"]
    assert {p for p, r in rows if r == 0.25} == {"expected_attention", "adakv_expected_attention", "kvzap_mlp_head",
                                                 "critical_snapkv", "critical_expected_attention", "chunkkv", "lagkv",
                                                 "kvzip", "kvzip_plus"}  # all but DuoAttention (its own folder)
    assert {r for p, r in crosscheck("duo")} == {0.25, 0.5, 0.75}
    states(doc, "(DuoAttention's in its own folder, above;")


def test_crosscheck_at_compression_0_75():
    rows, doc, readme = crosscheck("ratios"), "docs/crosscheck.md", "results/crosscheck/ratios/README.md"
    lens = json.loads((RESULTS / "crosscheck" / "ratios" / "summary.json").read_text())["prompt_tokens"]
    for r in rows.values():  # compare.py's table, row by row
        extra = r["rows_identical_or_ties"] - r["identical_rows"]
        states("results/crosscheck/ratios/table.md", (
            f"| {r['press'].replace('_', '_<wbr>')} | {r['kvbench'].replace('_', '_<wbr>')} | {r['ratio']:g} | "
            f"{r['identical_rows']}/{r['rows']}{f' (+{extra} at ties)' if extra else ''} | "
            f"{r['mean_common_prefix']:.3f} | {r['identical_sets']}/{r['sets']} |"))
    same = [rows[(p, 0.75)] for p in ("expected_attention", "adakv_expected_attention", "critical_expected_attention",
                                      "kvzip", "kvzip_plus")]
    assert all(r["identical_rows"] == r["rows"] and r["identical_sets"] == r["sets"] for r in same)
    states(doc, f"KVzip and KVzip+: {agreement(same[0])} each")
    states(readme, f"KVzip and KVzip+ at 0.75: {agreement(same[0], ',')} each")
    zap = rows[("kvzap_mlp_head", 0.75)]
    assert zap["identical_rows"] == zap["rows"]
    states(doc, f"KVzap {zap['identical_rows']} of {zap['rows']} rows, the {zap['sets'] - zap['identical_sets']} sets")
    states(readme, f"KVzap at 0.75: {agreement(zap, ',')}; each of the {zap['sets'] - zap['identical_sets']} sets")
    lag = rows[("lagkv", 0.75)]
    tied = [int(i) for i in lag["diverged_rows"]]
    assert set(lag["diverged_rows"].values()) == {"ties"}
    # the budget under LagKV's pairs scored 1: 4 sinks, the last 128-pair partition and the tail after it
    assert all(int(lens[i] * 0.25) < 4 + 128 + (lens[i] - 4) % 128 for i in tied)
    states(doc, f"LagKV at 0.75: identical tokens on {lag['identical_rows']} of {lag['rows']} rows. In the {len(tied)} others")
    states(readme, f"LagKV at 0.75: identical tokens on {lag['identical_rows']} of {lag['rows']} rows. In each of the "
                   f"{len(tied)} others", f"in row 3, {lens[3]} tokens, disjoint sets of {int(lens[3] * 0.25)} pairs")
    short = sorted(range(len(lens)), key=lambda i: lens[i])[:2]  # the two shortest prompts
    for press, name in (("critical_snapkv", "CriticalKV over SnapKV"), ("chunkkv", "ChunkKV over SnapKV")):
        r = rows[(press, 0.75)]
        assert sorted(map(int, r["diverged_rows"])) == sorted(short) and r["sets"] - r["identical_sets"] <= 2 * 90
        states(doc, f"{name} at 0.75: identical tokens on {r['identical_rows']} of {r['rows']} rows; every set of the other "
                    f"{r['rows'] - 2} rows identical")
        states(readme, f"{name} at 0.75: {agreement(r, ',')}; every set of the other {r['rows'] - 2} rows is identical.",
               f"Rows {min(short)} and {max(short)}")
    states(readme, f"keep {int(lens[short[1]] * 0.25)} and {int(lens[short[0]] * 0.25)} pairs, fewer than SnapKV's "
                   f"64-pair window", f"the first stage ({int(lens[short[0]] * 0.25 * 0.5)} pairs)",
           f"keep int({-(-lens[short[0]] // 20)} x 0.25) = {int(-(-lens[short[0]] // 20) * 0.25)} chunks")
    states(doc, f"keep {int(lens[short[1]] * 0.25)} and {int(lens[short[0]] * 0.25)} pairs, fewer than SnapKV's 64-pair "
                f"window", f"keep {int(-(-lens[short[0]] // 20) * 0.25)} chunks among the 3")



def test_crosscheck_of_compactor():
    rows = json.loads((RESULTS / "crosscheck" / "compactor" / "summary.json").read_text())["rows"]
    by = {r["ratio"]: r for r in rows}
    assert {r["press"] for r in rows} == {"compactor"} and set(by) == {0.25, 0.5, 0.75}
    assert by[0.5]["identical_rows"] >= 15 and by[0.5]["rows"] == 16
    at = [(x, f"identical tokens on {by[x]['identical_rows']} of {by[x]['rows']} rows", f"identical kept sets in "
           f"{by[x]['identical_sets']} of {by[x]['sets']}") for x in (0.25, 0.5, 0.75)]
    states("docs/crosscheck.md", "; ".join(f"at {'compression ' if x == 0.25 else ''}{x:g} {t} and {k}" for x, t, k in at))
    states("results/crosscheck/compactor/README.md", "; ".join(f"at {x:g}, {t}, {k}" for x, t, k in at))


# ------------------------------------------------------------------------------------ docs/matrix.md
def test_matrix_counts():
    """The whole product's counts and the preflight pass's time from its record (tests/data/matrix_product.json,
    recomputed against the oracle by tests/project/test_matrix_preflight.py, against the preflight by its
    `-m product` test); the cover over the recorded policies. (The re-rotation errors docs/matrix.md quotes are
    checked by tests/cache/test_rotate_half.py, which computes them.)"""
    from tests.matrix import POLICIES, pairwise, refusal
    from tests.matrix_preflight import SAMPLE, recorded

    rec = recorded()
    cover = pairwise(policies=tuple(p for p in POLICIES if p in rec["policies"]))
    states("docs/matrix.md", f"**pairwise cover** ({len(cover)} combinations, {sum(1 for c in cover if refusal(c))} of them refused)",
           f"of its {rec['combinations']:,} combinations, {rec['refused']:,} are refused before any model loads and "
           f"{rec['accepted']:,} run",
           f"{rec['pass']['cpu_s']} s of CPU time on one {rec['pass']['machine']} core)",
           f"checks a seeded sample of {SAMPLE:,},")


# -------------------------------------------------------------------------------- results/baselines
@cache
def baselines():
    """scripts/baselines_table.py's rows per task, from the committed records, scores and predictions."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("baselines_table", ROOT / "scripts" / "baselines_table.py")
    bt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bt)
    root = RESULTS / "baselines"
    recs = bt.newest(lines(root / "runs.jsonl"))
    out = {}
    for task in ("passkey", "cnndm", "narrativeqa"):
        rows, fkv = bt.task_rows(task, [r for r in recs if r["task"] == task], root)
        out[task] = (bt, rows, fkv)
    return out


def test_baselines_tables_md_is_its_records():
    committed = (RESULTS / "baselines" / "tables.md").read_text()
    for task, (bt, rows, fkv) in baselines().items():
        body = bt.table(task, rows, fkv, "").split("\n\n", 2)[2]  # the table, without its settings line
        assert body.strip() in committed, task


def test_baselines_readme_findings():
    from kvbench.stats import distinguishable

    doc = "results/baselines/README.md"
    rows = {t: {(x["policy"], x["schedule"], x["kv"], x["rerotate"]): x for x in v[1]} for t, v in baselines().items()}

    def x(task, policy, sched, kv, rerotate=False):
        return rows[task][(policy, {"pd": "prefill_and_decode", "d": "decode_only", None: None}[sched], kv, rerotate)]

    ag = lambda *k: f"{x(*k)['agree']['prefix']:.2f}"  # noqa: E731
    m = lambda *k, d=3: f"{x(*k)['metric']:.{d}f}"  # noqa: E731
    vs = lambda task, p, kv: f"{ag(task, p, 'pd', kv)} against {ag(task, p, 'd', kv)}"  # noqa: E731
    passkey_len = baselines()["passkey"][2]["prompts"]["tokens_mean"]
    states(doc, f"At kv 128 ({128 / passkey_len:.0%} of the passkey prompt)",
           f"Batch-Max {vs('passkey', 'batch_max', 128)}, SnapKV {vs('passkey', 'snapkv', 128)}, TOVA "
           f"{vs('passkey', 'tova', 128)}, Knorm {vs('passkey', 'knorm', 128)}, PyramidKV {vs('passkey', 'pyramidkv', 128)}",
           f"(SnapKV {vs('narrativeqa', 'snapkv', 256)} at kv 256, H2O {vs('narrativeqa', 'h2o', 256)})")
    scored = ("batch_max", "h2o", "keydiff", "knorm", "pyramidkv", "random", "snapkv", "tova")
    for kv in (128, 256):
        for p in scored:
            if (p, kv) != ("random", 128):  # "on NarrativeQA the same holds for every scored policy ... but random at kv 128"
                assert x("narrativeqa", p, "pd", kv)["agree"]["prefix"] < x("narrativeqa", p, "d", kv)["agree"]["prefix"], p
    pd = [r["peak_kv"] / 2**20 for t in rows for r in rows[t].values() if r["schedule"] == "prefill_and_decode"]
    dec = [r["peak_kv"] / 2**20 for t in rows for r in rows[t].values() if r["schedule"] == "decode_only"]
    states(doc, f"({min(pd):.0f} / {max(pd):.0f} MiB) where decode-only eviction first holds the whole prompt "
                f"({min(dec):.0f}-{max(dec):.0f} MiB)")
    tova = x("passkey", "tova", "pd", 256)
    assert x("passkey", "batch_max", "pd", 256)["agree"]["prefix"] == 1.0
    assert all(x("passkey", p, "pd", kv)["metric"] == 0 for p in ("snapkv", "pyramidkv") for kv in (128, 256))
    states(doc, f"finds every passkey ({m('passkey', 'batch_max', 'pd', 256)}, output identical to the full cache's) and "
                f"TOVA {round(tova['metric'] * 8)} of 8",
           f"(0.85 at kv 256). KeyDiff is the strongest at kv 128 on passkey (all "
           f"{round(x('passkey', 'keydiff', 'd', 128)['metric'] * 8)} under decode_only, "
           f"{round(x('passkey', 'keydiff', 'pd', 128)['metric'] * 8)} under P&D)")
    assert ag("narrativeqa", "snapkv", "d", 256) == "0.85"
    # CNN/DM at kv 256: who can be told from the full cache (paired interval excludes 0)
    dist = lambda p, s: distinguishable(x("cnndm", p, s, 256)["diff"]["ci"])  # noqa: E731
    assert not any(dist(p, s) for p in ("batch_max", "h2o", "keydiff", "tova") for s in ("pd", "d"))
    assert all(dist(p, s) for p, s in (("knorm", "pd"), ("knorm", "d"), ("snapkv", "d"), ("random", "pd")))
    assert all(dist(p, "pd") for p in ("window", "streaming_llm"))
    assert not any(dist(p, s) for p, s in (("snapkv", "pd"), ("pyramidkv", "pd"), ("pyramidkv", "d"), ("random", "d")))
    low = [r["metric"] for r in rows["cnndm"].values() if r["kv"] == 128]
    fkv = baselines()["cnndm"][2]["metrics"]["rouge2"]
    states(doc, f"At kv 128 every method scores below the full cache ({min(low):.3f}-{max(low):.3f} against {fkv:.3f})",
           f"{m('passkey', 'pyramidkv', 'd', 256, d=2)} against {m('passkey', 'snapkv', 'd', 256)} on passkey and "
           f"{m('cnndm', 'pyramidkv', 'd', 256)} against {m('cnndm', 'snapkv', 'd', 256)} ROUGE-2 on CNN/DM at kv 256",
           f"is raised to the floor of {x('cnndm', 'pyramidkv', 'd', 256)['budget']['min']} at both sizes")
    assert x("cnndm", "pyramidkv", "d", 128)["budget"]["min"] == x("cnndm", "pyramidkv", "d", 256)["budget"]["min"]
    # re-rotation
    assert x("passkey", "streaming_llm", "pd", 128)["metric"] == x("passkey", "streaming_llm", "pd", 128, True)["metric"]
    states(doc, f"StreamingLLM {m('passkey', 'streaming_llm', 'pd', 128, d=2)} on passkey with and without, Batch-Max "
                f"{m('passkey', 'batch_max', 'pd', 128, True)} on passkey and {m('cnndm', 'batch_max', 'pd', 128, True)} "
                f"against {m('cnndm', 'batch_max', 'pd', 128)} ROUGE-2 on CNN/DM",
           f"rose from {ag('passkey', 'batch_max', 'pd', 128)} to {ag('passkey', 'batch_max', 'pd', 128, True)}")
    # NarrativeQA's full cache, random as the floor
    assert baselines()["narrativeqa"][2]["metrics"]["rouge2"] == 0.0
    rnd = [r["agree"]["prefix"] for r in rows["cnndm"].values() if r["policy"] == "random"]
    others = [ag("passkey", p, "pd", 256) for p in ("window", "snapkv", "pyramidkv")]
    states(doc, f"(agreement at most {max(rnd):.2f})",
           f"({ag('passkey', 'random', 'pd', 256)} against {min(others)}-{max(others)})")
    # the runs
    allrecs = lines("results/baselines/runs.jsonl")
    assert len(allrecs) - len(baselines()["passkey"][0].newest(allrecs)) == 36
    states(doc, f"# {len(baselines()['passkey'][0].newest(allrecs))} runs -> runs.jsonl", "# 36 of them again")
    first = allrecs[:118]
    states(doc, f"# {len(first)} runs -> runs.jsonl, scores/, predictions/ "
                f"(about {sum(r['wall_s'] for r in first) / 60:.0f} min of run time on one core)")


# ------------------------------------------------------------------------------------ docs/tasks.md
def test_tasks_md_prompt_lengths():
    recs = lines("results/prompt_report/runs.jsonl")
    for task in ("cnndm", "narrativeqa", "gsm8k"):
        p = one(recs, task=task)["prompts"]
        assert p["n"] == 960
        states("docs/tasks.md", row(task, f"{p['tokens_mean']:g} / {p['tokens_median']:g} / {p['tokens_min']} / "
                                          f"{p['tokens_max']}", p["n_cut"]))


# ------------------------------------------------------------------------------ benchmark provenance
BENCHMARKS = ("bench_eviction", "bench_overhead", "bench_serve", "bench_throughput", "plan_vs_paper", "max_batch_table",
              "serve_goodput", "serve_compare")


@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_benchmark_records_its_line_with_provenance(name):
    src = (ROOT / "scripts" / f"{name}.py").read_text()
    assert "Provenance(" in src and ".emit(" in src


def test_provenance_line(tmp_path, monkeypatch):
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("provenance", ROOT / "scripts" / "provenance.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(sys, "argv", [str(ROOT / "scripts" / "bench_x.py"), "--n", "a b"])
    out = tmp_path / "sub" / "x.jsonl"
    mod.Provenance().emit({"ratio": 1.5}, out)
    mod.Provenance().emit({"ratio": 1.6}, out)
    a, b = lines(out)
    p = a["provenance"]
    assert (a["ratio"], b["ratio"]) == (1.5, 1.6)
    assert p["command"] == "python scripts/bench_x.py --n 'a b'"
    assert re.fullmatch(r"[0-9a-f]{40}", p["commit"] or "0" * 40) and p["cpus"] >= 1
    assert datetime.fromisoformat(p["started_at"]).tzinfo is not None
    assert isinstance(p["load_avg_1m_before"], float) and isinstance(p["load_avg_1m_after"], float)


# ------------------------------------------------------------------------- the paper's figures, quoted
def paper_rows() -> dict[str, dict[str, list]]:
    """docs/method.md's published tables (the one place the paper's figures are typed): task -> cells."""
    out, model = {}, None
    for x in (ROOT / "docs" / "method.md").read_text().splitlines():
        if "Llama-2-13b-chat on" in x or "Phi-3.5-mini-instruct on" in x:
            model = "Llama" if "Llama" in x else "Phi"
        m = re.fullmatch(r"\| (CNN/DM|NarrativeQA|GSM8K) \| (\d+), ([\d.]+) \(b=(\d+) OOM\) \| (\d+), ([\d.]+), ([\d.]+) \| (.*) \|", x)
        if m:
            bm = [[float(v) if "." in v else int(v) for v in run.split(", ")] for run in m[8].split("; ")]
            out[model, m[1]] = {"ed": (int(m[2]), float(m[3]), int(m[4])), "fkv": (int(m[5]), m[6], float(m[7])), "bm": bm}
    return out


def test_paper_figures_quoted_elsewhere_match_method_md():
    rows = paper_rows()
    assert len(rows) == 6
    for task in ("CNN/DM", "NarrativeQA", "GSM8K"):
        p = rows["Llama", task]
        (b, ed, b0), (fb, acc, ftps) = p["ed"], p["fkv"]
        bm = [f"{x[0]}, {x[1]}, {x[2]:.3f}, {x[3]:.1f}" for x in p["bm"]]
        states("results/mini/README.md", row("", "paper", f"{b}, 2, -, {ed:.1f} (b={b0} OOM)", f"{fb}, -, {acc}, {ftps:.1f}",
                                             *bm, ", ".join(f"{x[3] / ed:.2f}" for x in p["bm"]), ""))
    # results/plan/README.md's "paper b / b0" column
    for setting, line in ((s, one(lines("results/plan/plan_vs_paper.jsonl"), setting=s)) for s in PLAN_NAMES):
        model = "Llama" if "llama2" in setting else "Phi"
        task = {"cnndm": "CNN/DM", "narrativeqa": "NarrativeQA", "gsm8k": "GSM8K"}[setting.rsplit("_", 1)[1]]
        p = rows[model, task]
        assert line["paper"]["ED"] == [p["ed"][0], p["ed"][2]] and line["paper"]["FKV"] == p["fkv"][0]
        assert line["paper"]["BM"] == [[x[0], x[1]] for x in p["bm"]]


# ------------------------------------------------------------------------------- docs/benchmarks.md
def eviction_line(attention: str) -> dict:
    """The newest bench_eviction.jsonl line whose batch_max ran this backend."""
    return [r for r in lines("results/bench_eviction.jsonl") if r.get("batch_max_attention") == attention][-1]


def test_benchmarks_md_figures():
    doc = "docs/benchmarks.md"
    o = lines("results/bench_overhead.jsonl")[-1]
    states(doc, f"`{o['provenance']['command']}`", f"load average {o['provenance']['load_avg_1m_before']:.1f} when it began")
    for b in (1, 8):
        v = o[f"b{b}"]
        states(doc, row(b, f"{v['generate_tok_s']:.2f}", f"{v['kvbench_tok_s']:.2f}", f"{v['ratio']:.3f}",
                        "yes" if v["identical_tokens"] else "no"))
    e = eviction_line("fused")
    p = e["provenance"]
    states(doc, f"`{p['command']}`", f"load average {p['load_avg_1m_before']:.1f} before and {p['load_avg_1m_after']:.1f} after",
           row("decode tokens/s", f"{e['full_decode_tok_s']:.2f}", f"{e['batch_max_decode_tok_s']:.2f} ({e['speedup']:.2f}x full)",
               f"{e['window_decode_tok_s']:.2f}"),
           row("prefill s", f"{e['full_prefill_s']:.2f}", f"{e['batch_max_prefill_s']:.2f} ({e['prefill_vs_window']:.2f}x window)",
               f"{e['window_prefill_s']:.2f}"),
           row("peak KV bytes", f"{e['full_peak_kv_bytes']:,}", f"{e['batch_max_peak_kv_bytes']:,}", ""),
           f"counted {e['batch_max_scoring_s']:.2f} s in the fused attention",
           f"{e['batch_max_evict_s']:.2f} s in its {e['decode_evictions']} decode eviction: {e['overhead_share']:.1%} of its decode time",
           f"the difference is negative ({e['overhead_share_vs_window']:.1%})",
           f"`targets_met` is {str(e['targets_met']).lower()} in this line",
           f"held at {e['prefill_vs_window']:.2f}x",
           f"Batch-Max holds {e['full_peak_kv_bytes'] / e['batch_max_peak_kv_bytes']:.1f}x less",
           f"decoded at {e['window_decode_tok_s'] / e['batch_max_decode_tok_s']:.2f}x its speed")
    loads = [r["provenance"][k] for r in (o, e) for k in ("load_avg_1m_before", "load_avg_1m_after")]
    states(doc, f"load averages of {min(loads):.1f} to {max(loads):.0f} on 2 cores")
    a = lines("results/bench_eviction_attention.jsonl")[-1]
    assert a["targets_met"]
    states(doc, f"(load average {a['load_avg_1m_before']:.0f}-{a['load_avg_1m_after']:.0f}, {a['new_tokens']} new tokens): it met both")


def test_benchmarks_md_before_after():
    before, after = lines("results/bench_overhead_before_after.jsonl")
    assert before["provenance"]["commit"].startswith("14415f2") and after["provenance"]["commit"].startswith("923ff72")
    assert all(r["b1"]["identical_tokens"] and r["b8"]["identical_tokens"] for r in (before, after))
    states("docs/benchmarks.md",
           f"load average {before['provenance']['load_avg_1m_before']:.1f} before and "
           f"{after['provenance']['load_avg_1m_after']:.1f} after",
           f"{before['b1']['ratio']:.3f} before and {after['b1']['ratio']:.3f} after at batch 1, "
           f"{before['b8']['ratio']:.3f} before and {after['b8']['ratio']:.3f} after at batch 8",
           f"{before['b8']['kvbench_tok_s']:.2f} before and {after['b8']['kvbench_tok_s']:.2f} after at batch 8 while "
           f"`model.generate` measured {before['b8']['generate_tok_s']:.2f} and {after['b8']['generate_tok_s']:.2f}")


def test_benchmarks_md_eviction_before_after():
    before, after = lines("results/bench_eviction_before_after.jsonl")
    assert before["provenance"]["commit"].startswith("14415f2") and not after["provenance"]["dirty"]

    def cost(r):
        return r["batch_max_scoring_s"] + r["batch_max_evict_s"]

    states("docs/benchmarks.md",
           f"and `{after['provenance']['commit'][:7]}`, each in",
           f"load average {before['provenance']['load_avg_1m_before']:.1f} before and "
           f"{after['provenance']['load_avg_1m_after']:.1f} after): Batch-Max's attention statistics",
           f"took {before['overhead_share']:.1%} of its\ndecode time before and {after['overhead_share']:.1%} after "
           f"({cost(before):.2f} s and {cost(after):.2f} s)",
           f"decoded {before['batch_max_decode_tok_s']:.2f} tokens/s before and\n{after['batch_max_decode_tok_s']:.2f} "
           f"after, {before['speedup']:.2f}x and {after['speedup']:.2f}x the full cache")


def test_benchmarks_md_sdpa_line():
    e = eviction_line("sdpa")
    p = e["provenance"]
    states("docs/benchmarks.md", f"`{p['command']}`",
           f"load average {p['load_avg_1m_before']:.1f} before and {p['load_avg_1m_after']:.1f} after",
           f"Batch-Max spent {e['batch_max_scoring_s']:.2f} s computing and accumulating attention statistics and "
           f"{e['batch_max_evict_s']:.2f} s in its {e['decode_evictions']} decode eviction, {e['overhead_share']:.1%} of its decode time",
           f"Decode tokens/s: full {e['full_decode_tok_s']:.2f}, batch_max {e['batch_max_decode_tok_s']:.2f} ({e['speedup']:.2f}x full), "
           f"window {e['window_decode_tok_s']:.2f}; Batch-Max's prefill {e['prefill_vs_window']:.2f}x window's",
           f"the timers account for {e['overhead_share']:.1%} of Batch-Max's decode time, the difference to `window` is "
           f"{e['overhead_share_vs_window']:.1%}")

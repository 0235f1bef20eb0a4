"""docs/methods.md and results/methods_cost: the committed table is its records and plan rendered by
scripts/methods_cost.py, and every figure the page reads out of it is recomputed here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvbench.report import latest
from kvbench.results import read_records
from tests.project.test_docs_figures import states
from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "results" / "methods_cost"
MIB = 2**20


@pytest.fixture(scope="module")
def data():
    module = load_script("methods_cost")
    records = latest(read_records(FOLDER))
    plan = json.loads((FOLDER / "plan.jsonl").read_text().splitlines()[-1])
    return module, {r["policy"]: r for r in records
                    if r["mode"] == "run" and r.get("schedule") != "prefill_and_decode"}, plan, records


def served_runs(data, task: str = "cnndm") -> dict:
    """(policy, "after prefill" / "evicting during prefill") -> the newest served record on `task`."""
    module, _, _, records = data
    return module.served([r for r in records if r.get("status") == "ok" and r.get("task") == task])


def after_prefill(runs: dict) -> dict:
    return {name: r for (name, when), r in runs.items() if when == "after prefill"}


def test_table_is_its_records_and_plan(data):
    module, by, plan, records = data
    assert module.render(records, plan) == (FOLDER / "table.md").read_text()
    assert set(by) == set(plan["rows"]) and "extreme_decode" not in by and len(by) >= 20


def test_methods_md_states_what_the_records_give(data):
    _, by, plan, records = data
    full = by["full"]

    def x(name, field):
        return by[name][field] / full[field]

    whole = ("kvzip", "kvzip_plus", "kvgrad", "duo_attention")  # heads of different counts: the static cache's widest
    halved = [n for n in by if n not in ("full", *whole)]  # statistics, query windows and states given back too
    assert {round(x(n, "decode_kv_bytes_mean"), 2) for n in halved} == {0.51, 0.52}
    assert all(round(x(n, "decode_kv_bytes_mean"), 2) == 1.0 for n in whole)
    passing = ("kvzip", "kvzip_plus", "kvgrad")  # scoring passes over the whole context
    others = [n for n in by if n not in ("full", "pyramidkv", *passing)]
    peak_kv = sorted(round(x(n, "peak_kv_bytes"), 2) for n in others)
    peak_mem = sorted(round(x(n, "peak_mem_bytes"), 2) for n in others)
    half = sorted(by[n]["decode_kv_bytes_mean"] / MIB for n in halved)

    def batch(name, schedule):
        return plan["rows"][name][schedule]["max_batch_size"]

    def passes(name):
        r = by[name]
        return r["score_pass_s"] / (r["prefill_s"] - r["score_pass_s"])

    states("docs/methods.md",
           f"holds {full['decode_kv_bytes_mean'] / MIB:.1f} MiB on average",
           f"every method that frees memory at its compression {half[0]:.1f} to {half[-1]:.1f} MiB",
           f"the peak KV is {peak_kv[0]:.2f} to {peak_kv[-1]:.2f} of the full cache's and the peak memory "
           f"{peak_mem[0]:.2f} to {peak_mem[-1]:.2f}",
           f"raise the peak memory to {x('kvzip', 'peak_mem_bytes'):.2f}x the full cache's (KVzip+: "
           f"{x('kvzip_plus', 'peak_mem_bytes'):.2f}x), KVgrad's gradient passes to {x('kvgrad', 'peak_mem_bytes'):.2f}x; "
           f"PyramidKV's per-layer groups to {x('pyramidkv', 'peak_mem_bytes'):.2f}x",
           f"at {plan['limit_gb']:g} GiB, the largest batch after prefill is the full cache's "
           f"{batch('full', 'after_prefill')} for almost every method, {batch('pyramidkv', 'after_prefill')} for "
           f"PyramidKV, {batch('kvzip', 'after_prefill')} for KVzip and KVzip+ and {batch('kvgrad', 'after_prefill')} "
           "for KVgrad",
           f"KVgrad's batch of 4 is accounted {by['kvgrad']['peak_mem_bytes'] / 2**30:.1f} GiB (its gradient passes), "
           f"over the {plan['limit_gb']:g} GiB limit",
           f"KVgrad's took {by['kvgrad']['score_pass_s']:.1f} s of a {by['kvgrad']['prefill_s']:.1f} s prefill, "
           f"{passes('kvgrad'):.1f}x the rest of it",
           f"{batch('batch_max', 'prefill_and_decode')} for Batch-Max, H2O, TOVA and StreamingLLM, "
           f"{batch('snapkv', 'prefill_and_decode')} for SnapKV, PyramidKV, ExpectedAttention, KeyDiff, Knorm and VATP, "
           f"{batch('duo_attention', 'prefill_and_decode')} for DuoAttention",
           f"took {by['kvzip']['score_pass_s']:.1f} s of a {by['kvzip']['prefill_s']:.1f} s prefill: "
           f"{passes('kvzip'):.1f}x the rest of its prefill in the same run (KVzip+: {passes('kvzip_plus'):.1f}x)")
    served = after_prefill(served_runs(data))

    def srv(name, field):
        return served[name][field] / served["full"][field]

    states("docs/methods.md",
           f"KVzip, KVzip+ and KVgrad hold {srv('kvzip', 'decode_kv_bytes_mean'):.2f} of the full cache's pages on average while "
           f"decoding ({srv('kvzip', 'decode_kv_bytes_peak'):.2f} at the most), DuoAttention "
           f"{srv('duo_attention', 'decode_kv_bytes_mean'):.2f}")
    assert {round(srv(n, "decode_kv_bytes_mean"), 2) for n in ("kvzip", "kvzip_plus", "kvgrad")} == {round(srv("kvzip", "decode_kv_bytes_mean"), 2)}
    assert srv("kvzip", "decode_kv_bytes_mean") < 0.6
    assert all(served[n]["mode"] == "serve" and "serve" in " ".join(served[n]["extensions"]) for n in served)
    assert all(batch(n, "after_prefill") == batch("full", "after_prefill")
               for n in others)
    assert batch("kvzip", "after_prefill") == batch("kvzip_plus", "after_prefill")
    assert all(batch(n, "prefill_and_decode") == batch("batch_max", "prefill_and_decode")
               for n in ("h2o", "tova", "streaming_llm"))
    assert all(batch(n, "prefill_and_decode") == batch("snapkv", "prefill_and_decode")
               for n in ("pyramidkv", "expected_attention", "keydiff", "knorm", "vatp"))
    assert all("refused" in plan["rows"][n]["prefill_and_decode"]
               for n in ("kvzip", "kvzip_plus", "kvgrad", "lagkv", "chunkkv", "critical", "compactor"))


def test_evicting_during_prefill_is_read_as_recorded(data):
    """The third table (`--prefill`): every policy defined under prefill_and_decode ran there, the others were
    refused; the page's ranges are the records' (each new method below 0.6 of the full cache's peak KV but
    DuoAttention, whose retrieval heads keep every pair in mode=run)."""
    _, by, plan, records = data
    full = by["full"]
    pd = {r["policy"]: r for r in records
          if r.get("status") == "ok" and r["mode"] == "run" and r.get("schedule") == "prefill_and_decode"}
    assert set(pd) == {n for n, row in plan["rows"].items() if n != "full" and "refused" not in row["prefill_and_decode"]}

    def x(name, field):
        return pd[name][field] / full[field]

    rest = [n for n in pd if n != "duo_attention"]
    peak_kv = sorted(round(x(n, "peak_kv_bytes"), 2) for n in rest)
    peak_mem = sorted(round(x(n, "peak_mem_bytes"), 2) for n in rest)
    windowed = ("snapkv", "pyramidkv", "expected_attention")  # query windows / statistics kept while evicting
    assert {round(x(n, "decode_kv_bytes_mean"), 2) for n in windowed} == {round(x("snapkv", "decode_kv_bytes_mean"), 2)}
    assert {round(x(n, "decode_kv_bytes_mean"), 2) for n in rest if n not in windowed} == {0.49}
    assert all(x(n, "peak_kv_bytes") < 0.6 for n in ("expected_attention", "kvzap"))
    states("docs/methods.md",
           f"the peak KV is {peak_kv[0]:.2f} to {peak_kv[-1]:.2f} of the full cache's for every method defined there but "
           f"DuoAttention, and the peak\nmemory {peak_mem[0]:.2f} to {peak_mem[-1]:.2f}",
           f"The KV held during decode is 0.49\nof the full cache's, {x('snapkv', 'decode_kv_bytes_mean'):.2f} for SnapKV, "
           "PyramidKV and ExpectedAttention",
           f"DuoAttention holds {x('duo_attention', 'peak_kv_bytes'):.2f} there too")


def test_duo_attentions_floor_is_its_windows(data):
    """The page's bound on DuoAttention's decode KV: half the heads whole, half kvpress's on-the-fly windows."""
    from kvbench.artifacts.duo_patterns import ON_THE_FLY_WINDOWS

    _, by, _, records = data
    window = sum(ON_THE_FLY_WINDOWS)
    longest = by["full"]["prompts"]["tokens_max"] + by["full"]["max_new_tokens"]
    served = {n: r["decode_kv_bytes_mean"] for n, r in after_prefill(served_runs(data)).items()}
    assert 0.5 + 0.5 * window / longest < 0.7 < served["duo_attention"] / served["full"]  # the floor, then pages
    states("docs/methods.md", f"the other half {window} pairs each ({ON_THE_FLY_WINDOWS[0]} sinks, "
           f"{ON_THE_FLY_WINDOWS[1]} recent", f"(0.5 + 0.5 x {window} / {longest} for the longest)",
           f"sequences of more than {round(window / 0.2)} tokens")


def test_served_duo_attention_evicting_during_prefill(data):
    """DuoAttention served under prefill_and_decode (`--serve --prefill`, `--long`): what the page reads out of the
    second and fourth tables, against the served full cache on the same prompts; at 4k tokens its KV held while
    decoding and its peak are under 0.6 of the full cache's (issue bound), its floor computed from its windows."""
    from kvbench.artifacts.duo_patterns import ON_THE_FLY_WINDOWS

    cnn, long = served_runs(data), served_runs(data, "niah_single_1")
    full, lfull = cnn["full", "after prefill"], long["full", "after prefill"]

    def x(runs, full, when, field):
        return runs["duo_attention", when][field] / full[field]

    ev, ap = "evicting during prefill", "after prefill"
    n = lfull["prompts"]["tokens_max"]
    floor = 0.5 + 0.5 * sum(ON_THE_FLY_WINDOWS) / (n + lfull["max_new_tokens"])
    duo = [r for (name, _), r in long.items() if name in ("full", "duo_attention")]
    assert lfull["prompts"]["tokens_min"] == n and all(r["serve"]["preemptions"] == 0 for r in long.values())
    assert {r["serve"]["steps"] for r in duo} == {lfull["serve"]["steps"]}  # the same schedule
    assert floor <= x(long, lfull, ev, "decode_kv_bytes_mean") < 0.6 and x(long, lfull, ev, "peak_kv_bytes") < 0.6
    found = {w: round(r["metrics"]["string_match_all"] * 4) for (name, w), r in long.items() if name == "duo_attention"}
    states("docs/methods.md",
           f"its peak KV is {x(cnn, full, ev, 'peak_kv_bytes'):.2f} of the full cache's\nserved pages "
           f"({x(cnn, full, ap, 'peak_kv_bytes'):.2f} compressing after prefill)",
           f"4 prompts of {n:,} tokens served together) the floor is\n{floor:.2f} (0.5 + 0.5 x "
           f"{sum(ON_THE_FLY_WINDOWS)} / {n + lfull['max_new_tokens']:,})",
           f"DuoAttention holds {x(long, lfull, ev, 'decode_kv_bytes_mean'):.2f} of the full cache's\npages while "
           f"decoding and at its peak, against {x(long, lfull, ap, 'decode_kv_bytes_mean'):.2f} while decoding "
           f"({x(long, lfull, ap, 'peak_kv_bytes'):.2f} at the peak)",
           f"It found the needle in {found[ev]} of the 4 prompts evicting during prefill and in {found[ap]} of 4 after")
    assert round(x(long, lfull, ev, "decode_kv_bytes_peak"), 2) == round(x(long, lfull, ev, "peak_kv_bytes"), 2)


def test_at_4k_tokens_serving_frees_half_only_evicting_during_prefill(data):
    """The fourth table's other methods: what the page reads of them, against the served full cache; every run on
    the same schedule (the same steps, no preemption), so the page's averages compare."""
    long = served_runs(data, "niah_single_1")
    full = long["full", "after prefill"]
    others = ("expected_attention", "kvzap", "snapkv", "kvzip")
    assert {r["serve"]["steps"] for r in long.values()} == {full["serve"]["steps"]}
    assert all(r["serve"]["preemptions"] == 0 for r in long.values())
    assert ("kvzip", "evicting during prefill") not in long  # refused in preflight

    def x(name, when, field):
        return round(long[name, when][field] / full[field], 2)

    ap, ev = "after prefill", "evicting during prefill"
    mean_ap = {x(n, ap, "decode_kv_bytes_mean") for n in others}
    peak_ap = {x(n, ap, "decode_kv_bytes_peak") for n in others}
    mean_ev = {x(n, ev, "decode_kv_bytes_mean") for n in others if n != "kvzip"}
    peak_ev = {x(n, ev, "peak_kv_bytes") for n in others if n != "kvzip"}
    assert len(mean_ap) == len(mean_ev) == len(peak_ev) == 1 and max(mean_ev | peak_ev) < 0.6
    walls = [round(long[k]["wall_s"]) for k in long if k[0] != "kvzip"]
    kvzip = long["kvzip", ap]
    states("docs/methods.md",
           f"same {full['serve']['steps']} steps in every run, no preemption). Compressing after prefill, each holds "
           f"{mean_ap.pop():.2f} of the full cache's pages\non average over the decode steps ({min(peak_ap):.2f} to "
           f"{max(peak_ap):.2f} at the peak)",
           f"hold {mean_ev.pop():.2f} on average and {peak_ev.pop():.2f} at the peak (KVzip is defined after prefill "
           f"only). KVzip's scoring passes took\n{kvzip['score_pass_s']:.1f} s of its {kvzip['wall_s']:.1f} s run, "
           f"the others' runs {min(walls)} to {max(walls)} s.")

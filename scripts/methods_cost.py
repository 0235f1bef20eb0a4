"""What each eviction method really frees and costs, at compression ratio 0.5 against the full cache on the same
prompts: every registered policy under `experiment=methods_cost_cnndm` (SmolLM2-135M, 8 CNN/DM articles of at
most 1024 tokens at batch 4, 32 new tokens, the prompt compressed once after prefill).

    python scripts/methods_cost.py [--out results/methods_cost] [--data-dir ../shared/data] [--only snapkv,kvzip]
    python scripts/methods_cost.py --serve --only kvzip,duo_attention   # the same in mode=serve, into the same OUT
    python scripts/methods_cost.py --prefill   # the same evicting during prefill, into the same OUT
    python scripts/methods_cost.py --serve --prefill --only duo_attention   # served, evicting during prefill
    python scripts/methods_cost.py --long --only duo_attention   # served on 4k-token RULER prompts, both schedules

1. Runs each policy, one after the other in this one process (skip_existing: a rerun resumes where a crash
   stopped it) -> OUT/runs.jsonl: the KV held during decode (mean and peak over decode steps, measured
   from the cache's tensors), the peak KV and peak memory, prefill time with the scoring passes inside it,
   decode time, ROUGE-2 with its interval.
2. Plans each policy's largest batch at the experiment's accounted limit (2 GiB; kvbench-plan's account, no
   weights, SDPA, over the first 128 articles' prompts: the search's batches are capped at the prompts it has),
   after prefill as it ran, and evicting during prefill (schedule=prefill_and_decode, where the policy defines
   it) -> one JSON line with its provenance appended to OUT/plan.jsonl.
With --serve, step 1 runs in mode=serve instead (batch_size=1, serve.max_running=4: the same 4 prompts at once
over a paged pool, where each (layer, KV head) frees its own pages) and step 2 is skipped. With --prefill, step 1
runs under schedule=prefill_and_decode (Algorithm 1: the budget held from the first block on, blocks of p = 64),
for the policies defined there (the others are refused in preflight, one line each), and step 2 is skipped; both
flags: served, evicting during prefill. With --long, the full cache and the policies run in mode=serve on
RULER's niah_single_1 at 4096 tokens (the kvpress leaderboard's length; 4 prompts, 16 new tokens), after prefill
and evicting during prefill, and step 2 is skipped: what a method whose floor depends on the prompt's length
(DuoAttention's streaming heads keep 384 pairs whatever the prompt) holds at the leaderboard's length.
3. Writes OUT/table.md (`render`, which tests/project/test_methods_figures.py recomputes from the two files).

Not every policy runs as published here: extreme_decode (Algorithm 2 keeps 2 pairs while decoding: no ratio) is
left out; KVzap has no published scorer for this model, so a random one runs (`policy.scorer=tiny`: an MLP 8 wide,
where the published ones are 512 wide, so its cost is a little below theirs, and its choices mean nothing); DuoAttention's head pattern is calibrated on 16 CNN/DM
validation articles (none is published for this model). One thread (`--threads`): on 2 cores shared with other
jobs, two threads wait on each other at every small decode op; the times still measure contention too.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

EXPERIMENT = "methods_cost_cnndm"
SKIP = {"extreme_decode": "keeps 2 pairs while decoding (Algorithm 2): no compression ratio"}
CANDIDATES = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128]
SCHEDULES = ("after_prefill", "prefill_and_decode")  # planned: kvpress's protocol, and Batch-Max's (evicting in prefill)
LIMIT_GB = 2.0  # the experiment's memory.limit_gb
PLAN_PROMPTS = 128  # the plan's prompts: the first 128 articles (the search's batches are capped at the samples)
MIB = 2**20
# runs whose batch of 4 the account puts over LIMIT_GB run under this limit instead (KVgrad: its gradient pass,
# 3.4 GiB accounted); their planned batches stay at LIMIT_GB
RUN_LIMIT_GB = {"kvgrad": 4.0}
# long prompts (--long's 4k tokens, compare_sweep.py's 2k): KVzip's and KVzip+'s reconstruction passes need more
# than 2 GiB too
LONG_LIMIT_GB = {"kvzip": 4.0, "kvzip_plus": 4.0, **RUN_LIMIT_GB}


def extra(name: str, data_dir: str) -> list[str]:
    """The overrides a policy needs beyond the experiment's."""
    if name == "full":
        return ["policy.compression_ratio=null"]
    if name == "kvzap":
        return ["policy.scorer=tiny"]
    if name == "duo_attention":
        return [f"policy.calibration={calibration(data_dir)}", "policy.num_samples=16"]
    return []


def calibration(data_dir: str) -> str:
    """DuoAttention's calibration texts: the first 16 CNN/DM validation articles, written to a temporary file."""
    path = Path(tempfile.gettempdir()) / "kvbench-methods-cost-calibration.json"
    if not path.exists():
        with gzip.open(Path(data_dir) / "cnn_dailymail" / "validation.jsonl.gz", "rt") as f:
            texts = [json.loads(line)["article"] for _, line in zip(range(16), f, strict=False)]
        path.write_text(json.dumps(texts))
    return str(path)


def policies(only: str | None) -> list[str]:
    from kvbench.policies import registry

    names = [n for n in registry() if n not in SKIP]
    return [n for n in names if only is None or n in only.split(",") or n == "full"]


SERVE = ["mode=serve", "batch_size=1", "serve.max_running=4", "serve.plot=false"]  # the same 4 at once, paged
TASK = "cnndm"  # the experiment's task: the first three tables
LONG = ["task=niah_single_1", "task.context_length=4096", "task.n_samples=4", "gen.max_new_tokens=16",
        "serve.num_blocks=1024"]  # --long: a pool of 4 such requests at once (the default 256 blocks hold one)


def run_all(names: list[str], out: str, data_dir: str, serve: bool = False, prefill: bool = False,
            long: bool = False) -> None:
    """Every policy in this one process, one after the other (their times compare only within one process);
    `serve`: in mode=serve, where each (layer, KV head) frees its own pages; `prefill`: evicting during prefill
    (schedule=prefill_and_decode; the full cache is not run again, it has no schedule); `long`: served on LONG's
    prompts, the full cache and each policy after prefill and evicting during prefill."""
    runs = [(n, s) for n in names for s in ((None,) if n == "full" else SCHEDULES)] if long else [
        (n, "prefill_and_decode" if prefill else None) for n in names if not (prefill and n == "full")]
    jobs = []
    for name, schedule in runs:
        overrides = [f"experiment={EXPERIMENT}", f"policy={name}", *extra(name, data_dir), f"data.dir={data_dir}",
                     f"results_dir={out}", "skip_existing=true", *(SERVE if serve or long else []),
                     *(LONG if long else []), *([f"policy.schedule={schedule}"] if schedule else [])]
        limits = LONG_LIMIT_GB if long else RUN_LIMIT_GB
        jobs.append(overrides + ([f"memory.limit_gb={limits[name]}"] if name in limits else []))
    run_jobs(jobs, "methods_cost")


def run_jobs(jobs: list[list[str]], job_name: str) -> None:
    """Each job's overrides composed and run in this one process, one after the other; a failed run leaves its
    error record and the others go on (with skip_existing, a rerun resumes where a crash stopped it)."""
    from hydra import compose, initialize_config_dir

    from kvbench import run as kvrun
    from kvbench.config import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name=job_name):
        for overrides in jobs:
            print("kvbench " + " ".join(overrides), flush=True)
            try:
                rec = kvrun.run(compose("config", overrides=overrides))
            except Exception as e:  # noqa: BLE001 - a failed run leaves its error record; the others go on
                print(f"  {type(e).__name__}: {e}", flush=True)
                continue
            print(f"  {rec['status']}: prefill {rec.get('prefill_s')} s, decode {rec.get('decode_s')} s", flush=True)


def plan_all(names: list[str], out: str, data_dir: str) -> None:
    from hydra import compose, initialize_config_dir
    from provenance import Provenance

    from kvbench import capacity
    from kvbench.config import CONF_DIR

    prov, rows = Provenance(), {}
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="methods_cost"):
        for name in names:
            rows[name] = {}
            for schedule in SCHEDULES:
                rows[name][schedule] = plan_one(compose, capacity, [
                    f"experiment={EXPERIMENT}", f"policy={name}", *extra(name, data_dir), f"data.dir={data_dir}",
                    f"policy.schedule={schedule}", f"results_dir={out}/plans", "plan.backends=[sdpa]",
                    f"task.n_samples={PLAN_PROMPTS}", f"search.candidates=[{','.join(map(str, CANDIDATES))}]"], name)
    prov.emit({"bench": "methods_cost_plan", "experiment": EXPERIMENT, "limit_gb": LIMIT_GB, "attention": "sdpa",
               "candidates": CANDIDATES, "prompts": PLAN_PROMPTS, "rows": rows}, str(Path(out) / "plan.jsonl"))


def plan_one(compose, capacity, overrides: list[str], name: str) -> dict:
    """The policy's largest batch and first OOM under `overrides`, or the one line refusing them."""
    from kvbench.errors import ConfigError

    try:
        plan = capacity.plan(compose("config", overrides=overrides))["plan"]
    except ConfigError as e:
        return {"refused": str(e)}
    row = plan["rows"][-1] if name != "full" else next(r for r in plan["rows"] if r["method"] == "FKV")
    return {k: row[k] for k in ("max_batch_size", "first_oom_batch_size", "peak_bytes")}


def _x(v, full) -> str:
    return "-" if v is None or not full else f"{v / full:.2f}"


def _rouge(r: dict) -> str:
    m = r["metrics"]
    ci = m.get("rouge2_ci") or [None, None]
    return f"{m['rouge2']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]"


def _decode_kv(r: dict, full: dict) -> str:
    return f"{r['decode_kv_bytes_mean'] / MIB:.1f} ({_x(r['decode_kv_bytes_mean'], full['decode_kv_bytes_mean'])})"


def _tok_s(r: dict) -> str:
    return f"{r['generated_tokens'] / r['decode_s']:.1f}" if r.get("decode_s") else "-"


def _batch(p: dict) -> str:
    if "refused" in p:
        return "refused"
    return "-" if "max_batch_size" not in p else f"{p['max_batch_size'] or '-'} / {p['first_oom_batch_size'] or '-'}"


def render(all_records: list[dict], plan: dict) -> str:
    """The tables: one row per policy (the newest ok record of each), the full cache first."""
    records = [r for r in all_records if r.get("status") == "ok" and r.get("task") == TASK]  # --long's: their own table
    by = {r["policy"]: r for r in records if r.get("mode") == "run" and r.get("schedule") != "prefill_and_decode"}
    full = by.get("full")
    if full is None:
        raise ValueError("no full-cache record: nothing to compare against")
    head = ("| policy | ROUGE-2 [95% CI] | decode KV mean MiB (x full) | decode KV peak (x full) | peak KV (x full) "
            "| peak memory (x full) | prefill s (scoring passes) | decode tok/s | largest batch / first OOM | the same, "
            "evicting during prefill |")
    lines = ["**Compressing once after prefill** (kvpress's protocol), at compression ratio 0.5:", "", head,
             "|" + "---|" * 10]
    for name in ["full", *sorted(n for n in by if n != "full")]:
        r, p = by[name], plan["rows"].get(name, {})
        lines.append("| " + " | ".join([
            f"`{name}`", _rouge(r), _decode_kv(r, full),
            _x(r["decode_kv_bytes_peak"], full["decode_kv_bytes_peak"]),
            _x(r["peak_kv_bytes"], full["peak_kv_bytes"]),
            _x(r["peak_mem_bytes"], full["peak_mem_bytes"]),
            f"{r['prefill_s']:.1f}" + (f" ({r['score_pass_s']:.1f})" if r.get("score_pass_s") else ""),
            _tok_s(r),
            _batch(p.get("after_prefill", {})),
            _batch(p.get("prefill_and_decode", {}) if name != "full" else p.get("after_prefill", {})),
        ]) + " |")
    return ("\n".join(lines) + "\n" + render_serve(records) + render_prefill(records, full)
            + render_long(all_records))


def served(records: list[dict]) -> dict[tuple[str, str], dict]:
    """(policy, "after prefill" or "evicting during prefill") -> the newest served record of each."""
    return {(r["policy"], "evicting during prefill" if r.get("schedule") == "prefill_and_decode"
             else "after prefill"): r for r in records if r.get("mode") == "serve"}


def _served_rows(by: dict, full: dict, score) -> list[str]:
    """One row per served record, the full cache's first: its score, the KV its pages hold while decoding (mean,
    peak) and over the whole run, prefill included (peak KV), against the full cache's."""
    rows = []
    for name, when in sorted(by, key=lambda k: (k[0] != "full", k)):
        r = by[name, when]
        rows.append(f"| `{name}`{'' if name == 'full' else ', ' + when} | {score(r)} | {_decode_kv(r, full)} | "
                    f"{_x(r['decode_kv_bytes_peak'], full['decode_kv_bytes_peak'])} | "
                    f"{_x(r['peak_kv_bytes'], full['peak_kv_bytes'])} |")
    return rows


SERVED_HEAD = "decode KV mean MiB (x full) | decode KV peak (x full) | peak KV (x full) |"


def render_serve(records: list[dict]) -> str:
    """The policies also run in mode=serve (`--serve`): the KV their pages hold while decoding and over the whole
    run, against the full cache's pages ("" when none ran)."""
    by = served(records)
    full = by.get(("full", "after prefill"))
    if full is None:
        return ""
    lines = ["", "**In `mode=serve`**: the same 4 prompts at once over a paged pool, each (layer, KV head) freeing its "
             "own pages; the KV columns are the pages in use during decode steps and over the whole run, each against "
             "the same figure of the full cache's served (so a mean's ratio may exceed a peak's).", "", f"| policy, `mode=serve` | ROUGE-2 [95% CI] | {SERVED_HEAD}", "|" + "---|" * 5]
    return "\n".join(lines + _served_rows(by, full, _rouge)) + "\n"


def render_long(records: list[dict]) -> str:
    """`--long`: served on RULER niah_single_1 at 4096 tokens, against the full cache's pages ("" when none ran)."""
    by = served([r for r in records if r.get("status") == "ok" and r.get("task") == "niah_single_1"])
    full = by.get(("full", "after prefill"))
    if full is None:
        return ""
    lines = ["", "**At the leaderboard's length, in `mode=serve`** (`--long`): RULER niah_single_1 at 4096 tokens, 4 "
             "prompts served together (`serve.max_running=4`, a pool that holds them all), 16 new tokens.", "",
             f"| policy, `mode=serve` | needle found | {SERVED_HEAD}", "|" + "---|" * 5]
    return "\n".join(lines + _served_rows(by, full, lambda r: f"{r['metrics']['string_match_all']:.2f}")) + "\n"


def render_prefill(records: list[dict], full: dict) -> str:
    """The policies also run evicting during prefill (`--prefill`: schedule=prefill_and_decode), against the full
    cache's run: what the budget held from the first block on does to the peak ("" when none ran)."""
    by = {r["policy"]: r for r in records
          if r.get("status") == "ok" and r.get("mode") == "run" and r.get("schedule") == "prefill_and_decode"}
    if not by:
        return ""
    lines = ["", "**Evicting during prefill** (`schedule=prefill_and_decode`, blocks of 64): against the full cache's "
             "run of the first table.", "",
             "| policy, evicting during prefill | ROUGE-2 [95% CI] | decode KV mean MiB (x full) | peak KV (x full) "
             "| peak memory (x full) | prefill s | decode tok/s |", "|" + "---|" * 7]
    for name in sorted(by):
        r = by[name]
        lines.append("| " + " | ".join([
            f"`{name}`", _rouge(r), _decode_kv(r, full),
            _x(r["peak_kv_bytes"], full["peak_kv_bytes"]), _x(r["peak_mem_bytes"], full["peak_mem_bytes"]),
            f"{r['prefill_s']:.1f}", _tok_s(r)]) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "results" / "methods_cost"))
    p.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    p.add_argument("--only", default=None, help="comma-separated policies (the full cache always runs)")
    p.add_argument("--table-only", action="store_true", help="render OUT/table.md from what is there")
    p.add_argument("--plan-only", action="store_true", help="plan again, then render (the runs are kept)")
    p.add_argument("--serve", action="store_true", help="run the policies in mode=serve too (no plan)")
    p.add_argument("--prefill", action="store_true", help="run them evicting during prefill too (no plan)")
    p.add_argument("--long", action="store_true", help="serve them on 4k-token RULER prompts, both schedules (no plan)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: steady on a shared machine)")
    args = p.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    names = policies(args.only)
    if args.serve or args.prefill or args.long:
        run_all(names, args.out, args.data_dir, serve=args.serve, prefill=args.prefill, long=args.long)
    elif not (args.table_only or args.plan_only):
        run_all(names, args.out, args.data_dir)
    if not (args.table_only or args.serve or args.prefill or args.long):
        plan_all(names, args.out, args.data_dir)
    from kvbench.report import latest
    from kvbench.results import read_records

    plan = json.loads(Path(args.out, "plan.jsonl").read_text().splitlines()[-1])
    table = render(latest(read_records(args.out)), plan)
    Path(args.out, "table.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()

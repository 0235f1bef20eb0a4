"""The baselines comparison (scripts/compare_baselines.sh) as tables and plots.

Per task: one row per run of results/baselines/runs.jsonl (the newest record of each configuration):
the task metric with its 95% bootstrap interval, the paired difference to the full cache (FKV) on the
same samples with its interval, the agreement of the greedy output with FKV's (share of tokens equal up
to the first divergence, kvbench.stats), tokens/s, prefill seconds, peak KV and mean output length.
Plots: metric and agreement against kv size, one line per policy and schedule, FKV as a horizontal line.
Writes results/baselines/tables.md and results/baselines/plots/<task>.png.

`--strip-prompts` rewrites the predictions files without their prompt text (what the comparisons need is
kept: index, scores, generated ids), so that they are small enough to commit.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kvbench import compare

METRIC = {"passkey": "accuracy", "cnndm": "rouge2", "narrativeqa": "rouge2", "gsm8k": "accuracy"}
SHORT = {"prefill_and_decode": "P&D", "decode_only": "decode"}


def newest(records: list[dict]) -> list[dict]:
    by = {}
    for r in records:
        if r.get("status") == "ok":
            by[r["config_hash"]] = r
    return list(by.values())


def label(r: dict) -> str:
    pol = r["config"]["policy"]
    name = r["policy"] + (" +rerotate" if pol.get("rerotate") else "")
    return name if r["schedule"] is None else f"{name} ({SHORT[r['schedule']]})"


def fmt_ci(v, ci, digits=3, sign=""):
    if v is None:
        return "-"
    s = f"{v:{sign}.{digits}f}"
    return s if not ci else f"{s} [{ci[0]:{sign}.{digits}f}, {ci[1]:{sign}.{digits}f}]"


def strip_prompts(root: Path) -> None:
    for path in sorted((root / "predictions").glob("*.jsonl")):
        rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        if any("prompt" in r for r in rows):
            path.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "prompt"}) + "\n" for r in rows))


def task_rows(task: str, recs: list[dict], root: Path) -> tuple[list[dict], dict | None]:
    metric = METRIC[task]
    cache: dict = {}
    fkv = next((r for r in recs if r["policy"] == "full"), None)
    ref = compare.load(fkv, root, cache) if fkv else None
    rows = []
    for r in recs:
        s = compare.load(r, root, cache)
        v = compare.vs_fkv(s, ref, metric) if r is not fkv else None
        ln = compare.lengths(r, s)
        rows.append(dict(
            label=label(r), policy=r["policy"], schedule=r["schedule"], kv=r["kv_size"],
            rerotate=bool(r["config"]["policy"].get("rerotate")),
            metric=r["metrics"].get(metric), ci=r["metrics"].get(f"{metric}_ci"),
            diff=v.diff if v else None, agree=v.agreement if v else None,
            tok_s=r["throughput_tok_s"], prefill_s=r["prefill_s"], peak_kv=r["peak_kv_bytes"],
            out_len=(ln or {}).get("mean"), budget=r.get("kv_budget"), attention=r.get("attention") or "-",
        ))
    rows.sort(key=lambda x: (x["policy"] != "full", x["policy"] != "extreme_decode", x["kv"] or 0,
                             x["policy"], x["schedule"] or "", x["rerotate"]))
    return rows, fkv


def table(task: str, rows: list[dict], fkv: dict | None, settings: str) -> str:
    m = METRIC[task]
    out = [f"## {task} ({m})", "", settings, "",
           f"| policy (schedule) | kv | {m} [95% CI] | diff to FKV [95% CI] | agreement with FKV [95% CI] | tok/s | "
           "prefill s | attention | peak KV MiB | mean output tokens |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for x in rows:
        d, a = x["diff"], x["agree"]
        kv = x["kv"] or "-"
        if x["budget"] and x["budget"].get("per_layer"):
            kv = f"{kv} ({x['budget']['min']}-{x['budget']['max']}/layer)"
        out.append(
            f"| {x['label']} | {kv} | {fmt_ci(x['metric'], x['ci'])} | "
            f"{fmt_ci(d['mean'], d['ci'], sign='+') if d else '-'} | "
            f"{fmt_ci(a['prefix'], a['prefix_ci'], 2) if a else '-'} | {x['tok_s'] or 0:.1f} | "
            f"{x['prefill_s'] or 0:.1f} | {x['attention']} | {(x['peak_kv'] or 0) / 2**20:.1f} | "
            f"{'-' if x['out_len'] is None else format(x['out_len'], '.1f')} |"
        )
    return "\n".join(out) + "\n"


def plot(task: str, rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(7.5, 9.5), sharex=True)  # one column: legible at a page's width
    series: dict[str, list[dict]] = {}
    for x in rows:
        if x["kv"] is not None and not x["rerotate"] and x["policy"] != "extreme_decode":
            series.setdefault(x["label"], []).append(x)
    full = next((x for x in rows if x["policy"] == "full"), None)
    for i, (name, pts) in enumerate(sorted(series.items())):
        pts.sort(key=lambda p: p["kv"])
        kvs = [p["kv"] + (i - len(series) / 2) * 1.2 for p in pts]  # a small offset per series: bars stay apart
        style = "-" if "(decode)" not in name else "--"
        color = plt.cm.tab20(i % 20)
        ys = [p["metric"] for p in pts]
        err = [[y - p["ci"][0] for y, p in zip(ys, pts, strict=True)],
               [p["ci"][1] - y for y, p in zip(ys, pts, strict=True)]] if all(p["ci"] for p in pts) else None
        axes[0].errorbar(kvs, ys, yerr=err, fmt="o" + style, color=color, label=name, capsize=3, alpha=0.85)
        ag = [p["agree"]["prefix"] if p["agree"] else None for p in pts]
        if all(a is not None for a in ag):
            axes[1].plot(kvs, ag, "o" + style, color=color, label=name, alpha=0.85)
    if full:
        axes[0].axhline(full["metric"], color="black", lw=1, label="full cache")
        axes[1].axhline(1.0, color="black", lw=1)
    axes[0].set(ylabel=METRIC[task], title=f"{task}: {METRIC[task]} vs kv size")
    axes[1].set(xlabel="kv size (pairs per layer)", ylabel="tokens equal to FKV's\nbefore the first divergence (share)",
                title=f"{task}: agreement with the full cache")
    handles, labels = axes[0].get_legend_handles_labels()  # one legend for both panels, below them
    fig.legend(handles, labels, fontsize=8, ncol=3, loc="lower center", frameon=False)
    fig.tight_layout(rect=(0, 0.035 + 0.021 * ((len(labels) + 2) // 3), 1, 1))
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / f"{task}.png", dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", nargs="?", default="results/baselines")
    ap.add_argument("--strip-prompts", action="store_true")
    a = ap.parse_args()
    root = Path(a.root)
    if a.strip_prompts:
        strip_prompts(root)
    recs = newest([json.loads(x) for x in (root / "runs.jsonl").read_text().splitlines() if x.strip()])
    text = ["# Baselines on this CPU", "", "Made by `python scripts/baselines_table.py` from `runs.jsonl` "
            "(command: `scripts/compare_baselines.sh`).", ""]
    for task in ("passkey", "cnndm", "narrativeqa", "gsm8k"):
        mine = [r for r in recs if r["task"] == task]
        if not mine:
            continue
        rows, fkv = task_rows(task, mine, root)
        c = mine[0]["config"]
        size = (f"{c['task'].get('context_tokens')} context tokens" if task == "passkey" else
                f"{c['task'].get('n_shot')}-shot, inputs cut at {c['task'].get('max_input_tokens')} tokens")
        settings = (f"SmolLM2-135M (float32, CPU, 1 thread), {c['task']['n_samples']} samples, batch "
                    f"{mine[0]['batch_size']}, {c['gen']['max_new_tokens']} new tokens, {size}, p = 32 for every "
                    "policy; attention: `auto` (fused for the policies that need attention statistics, sdpa otherwise).")
        text.append(table(task, rows, fkv, settings))
        plot(task, rows, root / "plots")
    (root / "tables.md").write_text("\n".join(text))
    print("\n".join(text))


if __name__ == "__main__":
    main()

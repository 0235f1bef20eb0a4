"""Serving comparison at one pool: full vs window (streaming) vs batch_max vs h2o (kvbench mode=serve).

Runs `experiment=serve_cnndm` (SmolLM2-135M, 12 CNN/DM requests at time 0, a 64 x 16-token pool
holding about 4 full requests) once per policy in ONE process (the model is loaded once), the
evicting policies at the same `--kv-size`; window keeps 4 sink tokens (StreamingLLM), h2o keeps its
own defaults (decode_only: it holds the whole prompt until prefill ends, like OpenVINO). Records go
to `--out`/runs.jsonl (resumable: a policy already recorded there with the same config is skipped).
Writes `--out`/table.md, `--out`/compare.png (throughput, preemptions, TTFT, concurrency per
policy) and `--out`/utilisation.png (pool utilisation and running requests over time, all
policies), and prints ONE JSON line of ratios to full measured in this process, appended with its
`provenance` (command, commit, start time, load average) to `--out`/serve_compare.jsonl.

    python scripts/serve_compare.py [--kv-size 128] [--out results/serve] [--policies full,window,batch_max,h2o]
                                    [extra hydra overrides ...]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir

from kvbench.config import CONF_DIR
from kvbench.results import read_records
from kvbench.run import run

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import Provenance  # noqa: E402

POLICY_OVERRIDES = {
    "full": ["policy.kv_size=null"],  # the experiment's default kv_size is batch_max's
    "window": ["policy.protect_first=4"],
    "batch_max": [],
    "h2o": [],
    "tova": [],
}


def run_all(policies, kv_size, out, extra) -> list[dict]:
    recs = []
    for p in policies:
        ov = ["experiment=serve_cnndm", f"policy={p}", f"results_dir={out}", "skip_existing=true", *extra]
        ov += POLICY_OVERRIDES.get(p, []) if p == "full" else [f"policy.kv_size={kv_size}", *POLICY_OVERRIDES.get(p, [])]
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose("config", overrides=ov)
        rec = run(cfg)
        print(f"{p}: {rec['status']} {rec.get('error') or ''}", flush=True)
        recs.append(rec)
    return recs


def fmt(x, nd=2):
    return "-" if x is None else f"{x:.{nd}f}"


def table(recs) -> str:
    """One column per policy, one row per measure (a row per policy had 16 columns, wider than a page)."""
    def cells(r) -> list[str]:
        s = r["serve"]
        t, p = s["ttft_s"], s["tpot_s"]
        return [str(r["kv_size"] or "all"), str(s["completed"]), fmt(s["requests_per_s"], 3), fmt(s["output_tok_s"]),
                f"{fmt(t['p50'], 1)} / {fmt(t['p90'], 1)} / {fmt(t['p99'], 1)}",
                f"{fmt(p['p50'])} / {fmt(p['p90'])} / {fmt(p['p99'])}", str(s["steps"]), str(s["preemptions"]),
                str(s["recomputed_tokens"]), str(s["evicted_blocks"]), f"{fmt(s['running_mean'], 1)} / {s['running_max']}",
                f"{100 * s['pool_util_mean']:.0f}% / {100 * s['pool_util_max']:.0f}%", f"{r['peak_kv_bytes'] / 2**20:.1f}",
                fmt(r["metrics"].get("rouge2"), 4), fmt(r["wall_s"], 0)]

    measures = ["kv", "completed", "req/s", "out tok/s", "TTFT p50 / p90 / p99 (s)", "TPOT p50 / p90 / p99 (s)", "steps",
                "preemptions", "recomputed tokens", "evicted blocks", "running mean / max", "pool used mean / max",
                "peak KV (MiB)", "ROUGE-2", "wall (s)"]
    columns = [cells(r) for r in recs]
    rows = ["| policy | " + " | ".join(r["policy"] for r in recs) + " |", "|---|" + "---:|" * len(recs)]
    rows += [f"| {m} | " + " | ".join(c[i] for c in columns) + " |" for i, m in enumerate(measures)]
    return "\n".join(rows)


def plots(recs, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["policy"] for r in recs]
    S = [r["serve"] for r in recs]
    fig, ax = plt.subplots(2, 2, figsize=(8, 5.6))  # 2 x 2: legible at a page's width
    ax = ax.ravel()
    ax[0].bar(names, [s["output_tok_s"] for s in S])
    ax[0].set_title("output tokens/s")
    ax[1].bar(names, [s["preemptions"] for s in S])
    ax[1].set_title("preemptions")
    ax[2].bar(names, [s["ttft_s"]["p50"] for s in S], label="p50")
    ax[2].plot(names, [s["ttft_s"]["p90"] for s in S], "k_", markersize=20, label="p90")
    ax[2].set_title("TTFT (s)")
    ax[2].legend(fontsize=7)
    ax[3].bar(names, [s["running_mean"] for s in S])
    ax[3].set_title("requests running (mean)")
    for a in ax:
        a.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(out / "compare.png", dpi=110)
    plt.close(fig)
    fig, (a, b) = plt.subplots(2, 1, figsize=(8, 5), sharex=True)
    for r, s in zip(recs, S, strict=True):
        tl = s["timeline"]
        a.step(tl["t"], [100 * u / s["num_blocks"] for u in tl["blocks_used"]], where="post", label=r["policy"])
        b.step(tl["t"], tl["running"], where="post", label=r["policy"])
    a.set_ylabel("pool used (%)")
    b.set_ylabel("running requests")
    b.set_xlabel("engine clock (s)")
    a.legend(fontsize=8)
    a.set_title(f"{recs[0]['model']} {recs[0]['task']}: pool of {S[0]['num_blocks']} x {S[0]['block_size']} tokens",
                fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "utilisation.png", dpi=110)
    plt.close(fig)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kv-size", type=int, default=128)
    ap.add_argument("--out", default="results/serve")
    ap.add_argument("--policies", default="full,window,batch_max,h2o")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--report-only", action="store_true", help="no runs: table, plots and JSON from the records in --out")
    args, extra = ap.parse_known_args(argv)
    prov = Provenance(None if argv is None else [sys.argv[0], *argv])
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = Path(args.out)
    policies = args.policies.split(",")
    if args.report_only:
        last = {}
        for r in read_records(out):
            kv_ok = r["kv_size"] is None or r["kv_size"] == args.kv_size
            if r.get("mode") == "serve" and r["status"] == "ok" and kv_ok and r["policy"] in policies:
                last[r["policy"]] = r
        recs = [last[p] for p in policies if p in last]
    else:
        recs = run_all(policies, args.kv_size, out, extra)
        if any(r["status"] != "ok" for r in recs):
            raise SystemExit("a run failed: see " + str(out / "runs.jsonl"))
    (out / "table.md").write_text(
        f"# Serving comparison ({recs[0]['model']}, {recs[0]['task']}, kv_size={args.kv_size}; "
        "scripts/serve_compare.py)\n\n" + table(recs) + "\n"
    )
    plots(recs, out)
    full = next((r for r in recs if r["policy"] == "full"), None)
    line = {"kv_size": args.kv_size, "num_blocks": recs[0]["serve"]["num_blocks"]}
    for r in recs:
        s = r["serve"]
        line[r["policy"]] = {
            "output_tok_s": round(s["output_tok_s"], 3),
            "preemptions": s["preemptions"],
            "recomputed_tokens": s["recomputed_tokens"],
            "ttft_p50_s": round(s["ttft_s"]["p50"], 2),
            "running_mean": round(s["running_mean"], 2),
            "rouge2": r["metrics"].get("rouge2"),
        }
        if full is not None and r is not full:
            line[r["policy"]]["tok_s_vs_full"] = round(s["output_tok_s"] / full["serve"]["output_tok_s"], 3)
    prov.emit(line, out / "serve_compare.jsonl")


if __name__ == "__main__":
    main()

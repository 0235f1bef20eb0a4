"""Goodput under load: requests/s that meet a TTFT and a TPOT objective, against the arrival rate.

What it runs: `kvbench mode=serve` (through `kvbench.run.run`, one process, the model loaded once) for
each policy (default full, window with 4 sinks, batch_max, h2o) at each Poisson arrival rate, at the SAME
pool: SmolLM2-135M, CNN/DM test articles 0-shot cut at 512 tokens (prompts of varied length), 32 new tokens
with EOS ignored, a 64 x 16-token pool, kv 128 for the evicting policies, arrivals seeded by `seed`. Every
run is an ordinary record in `--out`/runs.jsonl (re-running resumes: recorded runs are skipped).

How to read the output: `--out`/goodput.md (one row per policy and rate: goodput, share meeting both
objectives, TTFT and TPOT p90, output tok/s, preemptions, recomputed tokens, peak KV), `--out`/goodput.png
(goodput against the arrival rate, one line per policy; beside it the peak KV and the preemptions), and
ONE JSON line with the goodput per policy and rate, appended with its `provenance` (command, commit, start
time, load average) to `--out`/goodput.jsonl. The engine's clock is the measured step time, so the
figures depend on the machine's load: run it alone.

    python scripts/serve_goodput.py [--rates 0.25 0.5 1 2] [--policies full,window,batch_max,h2o] [--out results/serve/goodput]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvbench.config import CONF_DIR  # noqa: E402
from kvbench.run import run as run_one  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import Provenance  # noqa: E402

POLICY = {"full": [], "window": ["policy.kv_size=128", "policy.protect_first=4"],
          "batch_max": ["policy.kv_size=128"], "h2o": ["policy.kv_size=128"]}


def run(policy: str, rate: float, args) -> dict:
    ov = ["experiment=serve_cnndm", f"policy={policy}", *POLICY[policy], f"serve.rate={rate}",
          f"task.n_samples={args.requests}", "task.max_input_tokens=512", "serve.plot=false", "skip_existing=true",
          f"serve.slo_ttft_s={args.slo_ttft}", f"serve.slo_tpot_s={args.slo_tpot}", f"results_dir={args.out}",
          f"data.dir={args.data_dir}"]
    if policy == "full":
        ov.append("policy.kv_size=null")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=ov)
    rec = run_one(cfg)
    print(f"{policy} rate={rate}: {rec['status']} {rec.get('error') or ''}", file=sys.stderr, flush=True)
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", type=float, nargs="+", default=[0.25, 0.5, 1.0, 2.0])
    ap.add_argument("--policies", default="full,window,batch_max,h2o")
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--slo-ttft", type=float, default=5.0)
    ap.add_argument("--slo-tpot", type=float, default=0.5)
    ap.add_argument("--data-dir", default=os.environ.get("DATA_DIR", "../shared/data"))
    ap.add_argument("--out", default="results/serve/goodput")
    args = ap.parse_args()
    prov = Provenance()
    rows = []
    for policy in args.policies.split(","):
        for rate in args.rates:
            rec = run(policy, rate, args)
            if rec["status"] == "ok":
                s = rec["serve"]
                rows.append({"policy": policy, "rate": rate, "goodput_rps": s["goodput_rps"],
                             "slo_attained": s["slo_attained"], "ttft_p90": s["ttft_s"]["p90"],
                             "tpot_p90": (s["tpot_s"] or {}).get("p90"), "output_tok_s": s["output_tok_s"],
                             "preemptions": s["preemptions"], "recomputed_tokens": s["recomputed_tokens"],
                             "peak_kv_mib": rec["peak_kv_bytes"] / 2**20, "running_max": s["running_max"]})
    out = Path(args.out)
    table(rows, args, out / "goodput.md")
    plot(rows, out / "goodput.png", args)
    prov.emit({"bench": "serve_goodput", "slo": {"ttft_s": args.slo_ttft, "tpot_s": args.slo_tpot}, "rows": rows},
              out / "goodput.jsonl")


def table(rows, args, path: Path) -> None:
    head = ("| policy | rate (req/s) | goodput (req/s) | met both objectives | TTFT p90 (s) | TPOT p90 (s) | "
            "out tok/s | preemptions | recomputed tokens | peak KV (MiB) | running max |")
    lines = [f"Objectives: TTFT <= {args.slo_ttft:g} s and TPOT <= {args.slo_tpot:g} s; {args.requests} CNN/DM requests "
             "(0-shot, cut at 512 tokens), 32 new tokens, a 64 x 16-token pool, kv 128.", "", head,
             "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        tpot = "-" if r["tpot_p90"] is None else f"{r['tpot_p90']:.3f}"
        lines.append(f"| {r['policy']} | {r['rate']:g} | {r['goodput_rps']:.3f} | {100 * r['slo_attained']:.0f}% | "
                     f"{r['ttft_p90']:.2f} | {tpot} | {r['output_tok_s']:.2f} | {r['preemptions']} | "
                     f"{r['recomputed_tokens']} | {r['peak_kv_mib']:.1f} | {r['running_max']} |")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def plot(rows, path: Path, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(8, 6.6))  # goodput across the top, its causes below: legible at a page's width
    grid = fig.add_gridspec(2, 2)
    a, b, c = fig.add_subplot(grid[0, :]), fig.add_subplot(grid[1, 0]), fig.add_subplot(grid[1, 1])
    for policy in dict.fromkeys(r["policy"] for r in rows):
        pts = [r for r in rows if r["policy"] == policy]
        x = [r["rate"] for r in pts]
        a.plot(x, [r["goodput_rps"] for r in pts], marker="o", label=policy)
        b.plot(x, [r["peak_kv_mib"] for r in pts], marker="o", label=policy)
        c.plot(x, [r["preemptions"] for r in pts], marker="o", label=policy)
    a.plot(x, x, color="grey", ls=":", lw=1, label="every request")
    a.set(xlabel="arrival rate (requests/s)", ylabel="goodput (requests/s)",
          title=f"goodput: requests/s meeting TTFT <= {args.slo_ttft:g} s and TPOT <= {args.slo_tpot:g} s")
    b.set(xlabel="arrival rate (requests/s)", ylabel="peak KV (MiB)", title="peak KV held")
    c.set(xlabel="arrival rate (requests/s)", ylabel="preemptions", title="preemptions")
    for ax in (a, b, c):
        ax.set_xscale("log", base=2)
    a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()

"""Uniform vs head-adaptive (AdaKV) budgets in serve mode, at one pool and the same total budget.

Runs `kvbench mode=serve` on the default model (SmolLM2-135M) for CNN/DM and passkey, SnapKV compressing each
request once when its prefill ends (`schedule=after_prefill`, kvpress's protocol, the one AdaKV is published
with) to `--kv-size` pairs per KV head on average, with `policy.head_budget=uniform` (every head that many)
and `adaptive` (AdaKV's split of each layer's pairs across its KV heads by score, each head at least
`head_floor` of the budget). Every layer keeps the same number of pairs either way; serve mode owns pages per
(layer, KV head), so an adaptive head that keeps fewer pairs holds fewer pages and the pool's free pages
serve the other requests. In one process (the model loads once), all requests at time 0, a fixed pool.

Records go to `--out`/runs.jsonl (resumable: a variant already recorded there is skipped); ONE JSON line per
invocation (each variant's requests served concurrently, output tokens/s, peak KV, preemptions and the task's
accuracy; adaptive over uniform) is printed and appended with its `provenance` to `--out`/bench.jsonl.

    python scripts/bench_serve_heads.py --data-dir ../shared/data [--kv-size 96] [--out results/serve_heads]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir

from kvbench import run as kvrun
from kvbench.config import CONF_DIR

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import Provenance  # noqa: E402

TASKS = {  # task overrides and the metric the comparison reads
    "cnndm": (["task=cnndm", "task.n_samples=5", "task.n_shot=0", "task.max_input_tokens=192"], "rouge2"),
    "passkey": (["task=passkey", "task.n_samples=5", "task.context_tokens=256"], "accuracy"),
}
VARIANTS = ("uniform", "adaptive")


def overrides(task: str, variant: str, args) -> list[str]:
    return [*TASKS[task][0], "model=smollm2-135m", "mode=serve", "policy=snapkv", "policy.schedule=after_prefill",
            f"policy.kv_size={args.kv_size}", f"policy.window={args.window}",
            f"serve.num_blocks={args.num_blocks}", "serve.block_size=16", "serve.max_tokens_per_step=256",
            "serve.rate=null", f"gen.max_new_tokens={args.new_tokens}", "gen.ignore_eos=true", "device=cpu",
            "logger=none", "serve.plot=false", f"data.dir={args.data_dir}", f"results_dir={args.out}",
            "skip_existing=true"] + ([f"policy.head_budget={variant}"] if variant != "uniform" else [])


def summary(rec: dict, metric: str) -> dict:
    s = rec["serve"]
    return {"accuracy": rec["metrics"].get(metric), "output_tok_s": s["output_tok_s"],
            "running_mean": s["running_mean"], "running_max": s["running_max"], "peak_kv_bytes": rec["peak_kv_bytes"],
            "preemptions": s["preemptions"], "evicted_blocks": s["evicted_blocks"], "wall_s": rec["wall_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default="../shared/data")
    ap.add_argument("--kv-size", type=int, default=96)
    ap.add_argument("--window", type=int, default=32)
    ap.add_argument("--num-blocks", type=int, default=40)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out", default="results/serve_heads")
    args = ap.parse_args()
    prov = Provenance()
    result = {"benchmark": "serve_head_budgets", "model": "smollm2-135m", "policy": "snapkv",
              "schedule": "after_prefill", "kv_size": args.kv_size, "window": args.window,
              "num_blocks": args.num_blocks, "block_size": 16, "new_tokens": args.new_tokens, "tasks": {}}
    for task in args.tasks.split(","):
        got = {}
        for variant in args.variants.split(","):
            with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
                cfg = compose("config", overrides=overrides(task, variant, args))
            rec = kvrun.run(cfg)
            if rec["status"] != "ok":
                raise SystemExit(f"{task} {variant}: {rec['status']} {rec.get('error')}")
            got[variant] = {"run_id": rec["run_id"], **summary(rec, TASKS[task][1])}
            print(f"{task} {variant}: {got[variant]}", file=sys.stderr, flush=True)
        if {"uniform", "adaptive"} <= set(got):
            u, a = got["uniform"], got["adaptive"]
            got["adaptive_over_uniform"] = {k: (a[k] / u[k] if u[k] else None) for k in
                                            ("output_tok_s", "running_mean", "peak_kv_bytes")}
        result["tasks"][task] = {"metric": TASKS[task][1], **got}
    prov.emit(result, Path(args.out) / "bench.jsonl" if args.out else None)


if __name__ == "__main__":
    main()

"""Tokens/s vs batch size for `full` and `batch_max` on SmolLM2 / CPU (issue 5), plotted to a PNG.

Does a larger batch pay on this machine? Every point is an ordinary kvbench run (`kvbench.run.run`,
its record appended to `<results-dir>/runs.jsonl`) over the same prompts: the first `--n-samples`
samples of the task, `--max-new-tokens` new tokens each (EOS ignored), one untimed warm-up batch,
throughput = generated tokens / wall time including prefill. `--n-samples` must be a multiple of
every batch size so each point runs exactly the same samples. Prints one JSON line per point and
appends it, with its `provenance` (command, commit, start time, load average), to `--out` (default
`results/throughput_vs_batch.jsonl`; `--out ''` only prints), then writes the plot. Points already
recorded in `--results-dir` are reused (a re-run resumes).

    python scripts/bench_throughput.py                     # CNN/DM 1-shot, b = 1..16: a quiet machine
    python scripts/bench_throughput.py --task passkey --context-tokens 256 --n-samples 4 \\
        --batch-sizes 1 2 4 --max-new-tokens 8 --results-dir /tmp/bench   # a smoke test
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir

from kvbench.config import CONF_DIR
from kvbench.run import run

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import Provenance  # noqa: E402

FIELDS = ("policy", "kv_size", "batch_size", "n_samples", "max_new_tokens", "status", "throughput_tok_s",
          "prefill_s", "decode_s", "wall_s", "generated_tokens", "peak_kv_bytes", "peak_mem_bytes", "run_id")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="cnndm", choices=["cnndm", "passkey"])
    p.add_argument("--data-dir", default="../shared/data", help="dataset mirror (cnndm)")
    p.add_argument("--context-tokens", type=int, default=1400, help="passkey filler length")
    p.add_argument("--n-samples", type=int, default=16)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--kv-size", type=int, default=256, help="batch_max's kv_size")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--results-dir", default="results/throughput")
    p.add_argument("--plot", default="results/throughput_vs_batch.png")
    p.add_argument("--out", default="results/throughput_vs_batch.jsonl", help="append the JSON lines here ('': print only)")
    a = p.parse_args(argv)
    bad = [b for b in a.batch_sizes if b <= 0 or a.n_samples % b]
    if a.n_samples <= 0 or bad:
        p.error(f"--n-samples={a.n_samples} must be a positive multiple of every batch size (not of {bad})")
    return a


def overrides(a: argparse.Namespace, policy: str, batch_size: int) -> list[str]:
    task = [f"task={a.task}", f"task.n_samples={a.n_samples}"]
    task += [f"data.dir={a.data_dir}"] if a.task == "cnndm" else [f"task.context_tokens={a.context_tokens}"]
    pol = ["policy=full"] if policy == "full" else ["policy=batch_max", f"policy.kv_size={a.kv_size}"]
    return [f"model={a.model}", *task, *pol, f"batch_size={batch_size}", f"gen.max_new_tokens={a.max_new_tokens}",
            "gen.ignore_eos=true", "gen.warmup=true", "device=cpu", f"results_dir={a.results_dir}",
            "skip_existing=true"]


def plot(points: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for policy in dict.fromkeys(p["policy"] for p in points):
        ok = [p for p in points if p["policy"] == policy and p["status"] == "ok"]
        kv = ok[0]["kv_size"] if ok else None
        label = policy + (f" (kv_size={kv})" if kv else "")
        ax.plot([p["batch_size"] for p in ok], [p["throughput_tok_s"] for p in ok], marker="o", label=label)
    sizes = sorted({p["batch_size"] for p in points})
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.set_xlabel("batch size")
    ax.set_ylabel("generated tokens / s (prefill included)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    a = parse(argv)
    prov = Provenance(None if argv is None else [sys.argv[0], *argv])
    points = []
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="bench_throughput"):
        for policy in ("full", "batch_max"):
            for b in a.batch_sizes:
                record = run(compose("config", overrides=overrides(a, policy, b)))
                point = {k: record.get(k) for k in FIELDS}
                point["prompt_tokens_mean"] = (record.get("prompts") or {}).get("tokens_mean")
                prov.emit(point, a.out)
                points.append(point)
    prompt = round(points[0]["prompt_tokens_mean"] or 0)
    plot(points, Path(a.plot), f"{a.model}, CPU, {a.task}: {a.n_samples} prompts of ~{prompt} tokens,\n"
                               f"{a.max_new_tokens} new tokens (EOS ignored)")
    print(f"plot: {a.plot}", file=sys.stderr)


if __name__ == "__main__":
    main()

"""`make demo`: a small comparison of the policies on the default model, printed as a table.

Runs the synthetic passkey task (needs nothing but the packaged model) and, when a dataset mirror
is given (`data.dir=...`, the Makefile passes ../shared/data or $DATA_DIR when present), a few
CNN/DailyMail samples too. Every run goes through `kvbench.run.run`, so the records land in
`runs.jsonl` like any other run's: under `outputs/demo` unless `results_dir=...` says where (the committed
`results/demo/` was made with `results_dir=results/demo`). Extra arguments are Hydra overrides for every run.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from hydra import compose, initialize_config_dir

from kvbench.config import CONF_DIR
from kvbench.policies import registry
from kvbench.run import run
from kvbench.tasks.passkey import FILLER, INSTRUCTION, QUESTION

# every registered policy (kvbench.policies.registry), at kv 256; those whose budget is fixed keep their own
# (DuoAttention's is its head pattern: half its heads streaming, sink + recent each, calibrated below)
FIXED_BUDGET = {"full": [], "extreme_decode": ["policy.kv_size=2"], "duo_attention": []}
POLICIES = [[f"policy={name}", *FIXED_BUDGET.get(name, ["policy.kv_size=256"])] for name in registry()]
RESULTS_DIR = "outputs/demo"  # the demo's own folder beside the root config's default (outputs)
TASK_OVERRIDES = {  # task -> the overrides the demo runs it with
    "passkey": ["task=passkey", "task.n_samples=8", "task.context_tokens=768", "gen.max_new_tokens=8", "batch_size=4"],
    # 0-shot and a short input: the 1-shot paper prompts (~1,900 tokens) take minutes per policy on a CPU
    "cnndm": ["task=cnndm", "task.n_samples=2", "task.n_shot=0", "task.max_input_tokens=384",
              "gen.max_new_tokens=24", "batch_size=2"],
}


def table(records: list[dict]) -> str:
    head = f"{'task':9} {'policy':15} {'kv_size':>7} {'schedule':19} {'b':>3} {'score':>14} {'tok/s':>7} {'peak KV MB':>10}"
    lines = [head, "-" * len(head)]
    for r in records:
        m = r.get("metrics") or {}
        key = "rouge2" if "rouge2" in m else "accuracy"
        score = f"{key}={m[key]:.3f}" if key in m else r["status"]
        tput = f"{r['throughput_tok_s']:.1f}" if r.get("throughput_tok_s") else "-"
        kv = f"{r['peak_kv_bytes'] / 2**20:.1f}" if r.get("peak_kv_bytes") else "-"
        lines.append(
            f"{r['task']:9} {r['policy']:15} {str(r['kv_size'] or '-'):>7} {str(r['schedule'] or '-'):19} "
            f"{r['batch_size']:>3} {score:>14} {tput:>7} {kv:>10}"
        )
    return "\n".join(lines)


def duo_calibration() -> str:
    """DuoAttention's calibration texts for the demo's model (no pattern is published for it): passkey retrieval
    texts, the kind of text its retrieval heads were found on, written to a temporary .jsonl."""
    texts = [INSTRUCTION + FILLER * (4 + 3 * i) + f"The pass key is {key}. Remember it. {key} is the pass key. "
             + FILLER * (40 - 3 * i) + QUESTION for i, key in enumerate((31415, 27182, 16180, 14142))]
    path = Path(tempfile.mkdtemp(prefix="kvbench-demo-")) / "duo_calibration.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in texts))
    return str(path)


def main(argv: list[str] | None = None) -> None:
    extra = list(sys.argv[1:] if argv is None else argv)
    policies = POLICIES
    if not any(a.startswith(("policy.calibration=", "policy.patterns=")) for a in extra):
        policies = [[*p, f"policy.calibration={duo_calibration()}"] if p[0] == "policy=duo_attention" else p
                    for p in POLICIES]
    has_data = any(a.startswith("data.dir=") and a.split("=", 1)[1] for a in extra)
    tasks = ["passkey"] + (["cnndm"] if has_data else [])
    records = []
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="demo"):
        for task in tasks:
            for pol in policies:
                cfg = compose("config", overrides=[f"results_dir={RESULTS_DIR}", *TASK_OVERRIDES[task], *pol, *extra])
                records.append(run(cfg))
                print(table(records[-1:]).splitlines()[-1], flush=True)
    print()
    print(table(records))
    print(f"\nrecords: {cfg.results_dir}/runs.jsonl")


if __name__ == "__main__":
    main()

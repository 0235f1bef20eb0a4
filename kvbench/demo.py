"""`make demo`: the paper's point at one memory limit, on the default model, printed as a table.

Every row is an ordinary kvbench run of `experiment=demo_passkey` (kvbench/conf/experiment/demo_passkey.yaml):
the synthetic passkey task (no dataset, no Hub), SmolLM2-135M in bfloat16 on the CPU, each run at the largest
batch that fits one accounted memory limit (`search.max_batch=true`, the search kvbench-reproduce uses). The
rows (`ROWS`): the full cache (the accuracy reference) and ED (kv 2, decoding-only: it holds the whole prompt
during prefill, the throughput bound of decoding-only eviction), Batch-Max at 512 pairs (on these prompts, the
smallest multiple of 64 where it keeps every key the full cache keeps) and at 256, and three baselines under
Batch-Max's schedule and budget (prefill_and_decode, kv 256, p 64), so that only their scores differ. A row
whose score is below the full cache's says why in one sentence (`REASONS`).

`--all` (`make demo ALL=1`): every registered policy instead (kvbench.policies.registry), each under its own
default schedule at kv 256 and batch 4, in float32, on passkey and, when `data.dir` is given, 2 CNN/DailyMail
articles: the former demo, slow on a CPU (the policies that score the prompt in extra passes take minutes each).

Records land in `runs.jsonl` under `outputs/demo` unless `results_dir=...` says where (the committed
`results/demo/` was made with `results_dir=results/demo`). Extra arguments are Hydra overrides for every run.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from hydra import compose, initialize_config_dir

from kvbench.cli import checked, preflight
from kvbench.config import CONF_DIR
from kvbench.policies import registry
from kvbench.run import run
from kvbench.tasks.passkey import FILLER, INSTRUCTION, QUESTION

PROG = "kvbench-demo"
EXPERIMENT = "experiment=demo_passkey"
SAME_SCHEDULE = ["policy.kv_size=256", "policy.schedule=prefill_and_decode", "policy.evict_every=64"]
ROWS = [  # the default demo: each row's overrides on top of EXPERIMENT
    ["policy=full"],
    ["policy=extreme_decode", "policy.kv_size=2"],
    ["policy=batch_max", "policy.kv_size=512"],
    ["policy=batch_max", "policy.kv_size=256"],
    *[[f"policy={name}", *SAME_SCHEDULE] for name in ("streaming_llm", "h2o", "tova")],
]
REASONS = {  # policy -> why it loses a retrieval task (printed where its score is below the full cache's)
    "extreme_decode": "at most 2 pairs after prefill: the throughput bound, it forgets the prompt",
    "batch_max": "retrieval needs what average attention evicts: the key goes before the question",
    "streaming_llm": "4 sinks + the newest pairs: a key further back than the budget is gone",
    "window": "the newest pairs only: a key further back than the budget is gone",
    "h2o": "the most-attended pairs + the newest half: the key is not among them",
    "tova": "keeps what the newest query reads: in prefill that is filler, not the question",
}
OTHER_REASON = "its budget does not keep what the answer needs"

# --all: every registered policy at kv 256; those whose budget is fixed keep their own (DuoAttention's is its
# head pattern: half its heads streaming, sink + recent each, calibrated below)
FIXED_BUDGET = {"full": [], "extreme_decode": ["policy.kv_size=2"], "duo_attention": []}
POLICIES = [[f"policy={name}", *FIXED_BUDGET.get(name, ["policy.kv_size=256"])] for name in registry()]
RESULTS_DIR = "outputs/demo"  # the demo's own folder beside the root config's default (outputs)
TASK_OVERRIDES = {  # --all: task -> the overrides it runs with
    "passkey": ["task=passkey", "task.n_samples=8", "task.context_tokens=768", "gen.max_new_tokens=8", "batch_size=4"],
    # 0-shot and a short input: the 1-shot paper prompts (~1,900 tokens) take minutes per policy on a CPU
    "cnndm": ["task=cnndm", "task.n_samples=2", "task.n_shot=0", "task.max_input_tokens=384",
              "gen.max_new_tokens=24", "batch_size=2"],
}


def score(rec: dict) -> tuple[str, float] | None:
    """The record's task metric (name, value), None when it has none (a failed run)."""
    m = rec.get("metrics") or {}
    key = "rouge2" if "rouge2" in m else "accuracy"
    return (key, m[key]) if key in m else None


def why(rec: dict, full: dict | None) -> str:
    """One sentence where `rec` scores below the full cache's record `full` of its task, else ''."""
    mine, ref = score(rec), score(full) if full else None
    if mine is None or ref is None or rec["policy"] == "full" or mine[1] >= ref[1]:
        return ""
    return REASONS.get(rec["policy"], OTHER_REASON) if rec["task"] == "passkey" else OTHER_REASON


def table(records: list[dict]) -> str:
    """A header, a rule, a row per record (the batch is the one it ran: the largest that fits, when searched);
    under a row whose score is below the full cache's, one line saying why."""
    head = f"{'task':8} {'policy':14} {'schedule':18} {'kv':>4} {'batch':>5} {'score':>14} {'tok/s':>6} {'peak KV MB':>10}"
    lines = [head, "-" * len(head)]
    full = {r["task"]: r for r in records if r["policy"] == "full" and score(r)}
    for r in records:
        s = score(r)
        shown = f"{s[0]}={s[1]:.3f}" if s else r["status"]
        tput = f"{r['throughput_tok_s']:.1f}" if r.get("throughput_tok_s") else "-"
        kv = f"{r['peak_kv_bytes'] / 2**20:.1f}" if r.get("peak_kv_bytes") else "-"
        schedule = r["schedule"] if r["policy"] != "full" and r["schedule"] else "-"
        lines.append(f"{r['task']:8} {r['policy']:14} {schedule:18} {str(r['kv_size'] or '-'):>4} "
                     f"{r['batch_size']:>5} {shown:>14} {tput:>6} {kv:>10}")
        if reason := why(r, full.get(r["task"])):
            lines.append(f"{'':9}why: {reason}")
    return "\n".join(lines)


def setting(records: list[dict]) -> str:
    """What every row of the default demo shares, from its records: the prompts, the model, the limit."""
    r = records[0]
    p = r["prompts"]
    return (f"{r['task']}: {p['n']} prompts of {p['tokens_max']} tokens, {r['max_new_tokens']} new tokens each\n"
            f"{r['model']}: {r['weights']}\n"
            f"batch: the largest that fits {r['config']['memory']['limit_gb']} GiB (accounted)")


def duo_calibration() -> str:
    """DuoAttention's calibration texts for the demo's model (no pattern is published for it): passkey retrieval
    texts, the kind of text its retrieval heads were found on, written to a temporary .jsonl."""
    texts = [INSTRUCTION + FILLER * (4 + 3 * i) + f"The pass key is {key}. Remember it. {key} is the pass key. "
             + FILLER * (40 - 3 * i) + QUESTION for i, key in enumerate((31415, 27182, 16180, 14142))]
    path = Path(tempfile.mkdtemp(prefix="kvbench-demo-")) / "duo_calibration.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in texts))
    return str(path)


def every_policy(extra: list[str]) -> list[list[str]]:
    """--all: every registered policy's overrides, per task (CNN/DM only when `data.dir` is given)."""
    policies = POLICIES
    if not any(a.startswith(("policy.calibration=", "policy.patterns=")) for a in extra):
        policies = [[*p, f"policy.calibration={duo_calibration()}"] if p[0] == "policy=duo_attention" else p
                    for p in POLICIES]
    has_data = any(a.startswith("data.dir=") and a.split("=", 1)[1] for a in extra)
    return [[f"results_dir={RESULTS_DIR}", *TASK_OVERRIDES[task], *pol]
            for task in ["passkey"] + (["cnndm"] if has_data else []) for pol in policies]


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    flags, extra = [a for a in args if a.startswith("--")], [a for a in args if not a.startswith("--")]
    for flag in flags:
        if flag != "--all":
            print(f"{PROG}: error: {flag}: unknown flag (--all runs every registered policy)", file=sys.stderr)
            sys.exit(2)
    runs = every_policy(extra) if flags else [[EXPERIMENT, *row] for row in ROWS]
    runs = [[*r, *extra] for r in runs]
    for overrides in runs:  # every run's config is checked before the first one runs: bad input, one line, exit 2
        checked(preflight, overrides, PROG)
    records = []
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="demo"):
        for overrides in runs:
            cfg = compose("config", overrides=overrides)
            records.append(run(cfg))
            print(table(records[-1:]).splitlines()[-1], flush=True)
    print()
    if not flags:
        print(setting(records))
    print(table(records))
    print(f"\nrecords: {cfg.results_dir}/runs.jsonl")


if __name__ == "__main__":
    main()

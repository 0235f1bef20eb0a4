"""The largest batch b and first OOM b0 of every `search.max_batch` record in a results directory, per
policy and kv size (rows) and attention backend x Batch-Max first-block chunking (columns), next to what
kvbench-plan predicts for the same setting without loading weights (same process, same account).

    python scripts/max_batch_table.py results/mini_eager [--experiment mini_eager_cnndm] [--data-dir ../shared/data]

Prints one JSON line (searched and planned cells) and appends it, with its `provenance` (command, commit,
start time, load average), to RESULTS_DIR/max_batch.jsonl; writes RESULTS_DIR/max_batch.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvbench import capacity  # noqa: E402
from kvbench.config import CONF_DIR  # noqa: E402
from kvbench.report import METHODS, attention_of, latest  # noqa: E402
from kvbench.results import read_records  # noqa: E402

sys.path.insert(0, str(ROOT / "scripts"))
from provenance import Provenance  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results_dir")
    p.add_argument("--experiment", default="mini_eager_cnndm")
    p.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    args = p.parse_args()
    prov = Provenance()
    searched: dict[tuple, tuple] = {}
    for r in latest(read_records(args.results_dir)):
        s = r.get("search")
        if s and r["status"] == "ok":
            chunk = (r["config"].get("gen") or {}).get("prefill_chunk")
            searched[(METHODS.get(r["policy"], r["policy"]), r["kv_size"]), (attention_of(r), chunk)] = (
                s["max_batch_size"], s["first_oom_batch_size"])
    columns = sorted({c for _, c in searched}, key=lambda c: (c[0] != "sdpa", c[1] or 0))
    rows = sorted({k for k, _ in searched}, key=lambda k: (["ED", "FKV"].index(k[0]) if k[0] in ("ED", "FKV") else 2,
                                                           k[1] or 0))
    kvs = sorted({kv for m, kv in rows if m not in ("ED", "FKV")})
    planned: dict[tuple, tuple] = {}
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="max_batch_table"):
        for backend, chunk in columns:
            cfg = compose("config", overrides=[
                f"experiment={args.experiment}", f"data.dir={args.data_dir}", f"plan.backends=[{backend}]",
                f"plan.kv_sizes=[{','.join(map(str, kvs))}]", f"gen.prefill_chunk={'null' if chunk is None else chunk}",
                f"results_dir={args.results_dir}"])
            for r in capacity.plan(cfg)["plan"]["rows"]:
                planned[(r["method"], r["kv_size"]), (backend, chunk)] = (r["max_batch_size"], r["first_oom_batch_size"])

    def fmt(v):
        return "-" if v is None else f"{v[0]} / {v[1] or '-'}"

    def label(c):
        return f"{c[0]}, first block " + ("in chunks of p" if c[1] is None else f"whole (prefill_chunk={c[1]})")

    lines = ["| method | kv | " + " | ".join(label(c) for c in columns) + " |", "|---|---:|" + "---|" * len(columns)]
    same = True
    for k in rows:
        cells = []
        for c in columns:
            s, pl = searched.get((k, c)), planned.get((k, c))
            same &= s == pl
            cells.append(fmt(s) + ("" if s == pl else f" (plan {fmt(pl)})"))
        lines.append(f"| {k[0]} | {k[1] or '-'} | " + " | ".join(cells) + " |")
    text = ["# Largest batch / first OOM (b0), search.max_batch=true", "",
            f"`python scripts/max_batch_table.py {args.results_dir}`: every cell is a search record"
            " (`search.only=true`); " + ("kvbench-plan predicts every one of them exactly." if same else
                                          "where kvbench-plan predicts otherwise its figure is in brackets."),
            "", *lines]
    Path(args.results_dir, "max_batch.md").write_text("\n".join(text) + "\n")
    prov.emit({"same_as_plan": same,
               "searched": {f"{k[0]} {k[1]} | {c[0]} {c[1]}": v for (k, c), v in searched.items()},
               "planned": {f"{k[0]} {k[1]} | {c[0]} {c[1]}": v for (k, c), v in planned.items()}},
              Path(args.results_dir, "max_batch.jsonl"))


if __name__ == "__main__":
    main()

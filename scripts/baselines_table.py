"""The baselines comparison (scripts/compare_baselines.sh) as a markdown table: one row per run of
results/baselines/runs.jsonl (metric, tokens/s, peak KV), written to results/baselines/table.md."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(root: str = "results/baselines") -> None:
    rows = [json.loads(line) for line in open(Path(root) / "runs.jsonl") if line.strip()]
    out = ["| policy | schedule | kv_size | p | rerotate | accuracy | tok/s | prefill s | peak KV MiB | status |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        pol = r["config"]["policy"]
        acc = (r.get("metrics") or {}).get("accuracy")
        out.append(
            f"| {r['policy']} | {r['schedule'] or '-'} | {r['kv_size'] or '-'} | {r['evict_every'] or '-'} | "
            f"{'yes' if pol.get('rerotate') else 'no'} | {'-' if acc is None else f'{acc:.3f}'} | "
            f"{r.get('throughput_tok_s') or 0:.2f} | {r.get('prefill_s') or 0:.1f} | "
            f"{(r.get('peak_kv_bytes') or 0) / 2**20:.1f} | {r['status']} |"
        )
    text = "\n".join(out) + "\n"
    (Path(root) / "table.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main(*sys.argv[1:])

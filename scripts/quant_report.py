"""The quantized-KV table and plot from scripts/quant_table.sh's records (results/mini_quant/runs.jsonl).

One row per (task, policy, bits): accuracy with its 95% bootstrap interval (CNN/DM: ROUGE-2; passkey: accuracy),
the largest batch the accounted limit allows and the first that does not, tokens/s, peak KV and peak memory at
that batch. The plot puts accuracy against the largest batch, one panel per task, so what a bit width buys in
batch sits beside what it costs in accuracy. Each (task, policy, bits) is its newest ok record.

    python scripts/quant_report.py [results/mini_quant]   # writes table.md and accuracy_vs_batch.png there
"""

from __future__ import annotations

import sys
from pathlib import Path

from kvbench.report import latest
from kvbench.results import read_records

MIB = 2**20
BITS = {"auto": 32, "int8": 8, "int4": 4}  # the model's dtype on this CPU is float32
POLICIES = ("full", "batch_max", "snapkv")
TASKS = {"cnndm": "rouge2", "passkey": "accuracy"}
SHIFT = {32: 0.93, 8: 1.0, 4: 1.07}  # the plot's x offsets per bit width (a log axis)


def bits(r: dict) -> int:
    return BITS[r["config"]["gen"]["kv_cache_dtype"]]


def rows(records: list[dict]) -> dict[tuple[str, str, int], dict]:
    """(task, policy, bits) -> its record (the ok ones of the table's grid)."""
    out = {}
    for r in latest(records):
        if r["status"] == "ok" and r["task"] in TASKS and r["policy"] in POLICIES:
            out[(r["task"], r["policy"], bits(r))] = r
    return out


def metric(r: dict) -> tuple[float, list[float]]:
    name = TASKS[r["task"]]
    return r["metrics"][name], r["metrics"][f"{name}_ci"]


def render(records: list[dict]) -> str:
    by = rows(records)
    lines = ["| task | policy | KV bits | accuracy [95% CI] | largest batch | first over | tokens/s | peak KV (MiB) "
             "| peak memory (MiB) |", "|---|---|---|---|---|---|---|---|---|"]
    for (task, policy, b), r in sorted(by.items(), key=lambda kv: (list(TASKS).index(kv[0][0]),
                                                                    POLICIES.index(kv[0][1]), -kv[0][2])):
        m, (lo, hi) = metric(r)
        s = r["search"]
        over = s["first_oom_batch_size"] if s["first_oom_batch_size"] is not None else "-"
        kv = "" if policy == "full" else f" kv={r['kv_size']}"
        lines.append(f"| {task} ({TASKS[task]}) | {policy}{kv} | {b} | {m:.3f} [{lo:.3f}, {hi:.3f}] | "
                     f"{s['max_batch_size']} | {over} | {r['throughput_tok_s']:.1f} | {r['peak_kv_bytes'] / MIB:.1f} "
                     f"| {r['peak_mem_bytes'] / MIB:.0f} |")
    return "\n".join(lines) + "\n"


def plot(records: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = rows(records)
    fig, axes = plt.subplots(1, len(TASKS), figsize=(9.6, 4.0))
    marker = {32: "o", 8: "s", 4: "^"}
    colour = {p: plt.get_cmap("tab10")(i) for i, p in enumerate(POLICIES)}
    for ax, task in zip(axes, TASKS, strict=True):
        for (t, policy, b), r in sorted(by.items()):
            if t != task:
                continue
            m, (lo, hi) = metric(r)
            x = r["search"]["max_batch_size"] * SHIFT[b]  # side by side where two widths found one batch
            ax.errorbar([x], [m], yerr=[[m - lo], [hi - m]], fmt=marker[b], color=colour[policy], capsize=3,
                        label=f"{policy}, {b}-bit" if b != 32 else f"{policy}, float32")
        ax.set_xscale("log", base=2)
        ax.set_xticks([1, 2, 4, 8, 16, 32], labels=["1", "2", "4", "8", "16", "32"])
        ax.set_xlabel("largest batch at the accounted limit")
        ax.set_ylabel(TASKS[task])
        ax.set_title(task, fontsize=9)
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right", fontsize=7)
    fig.tight_layout(rect=(0, 0, 0.8, 1))
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main() -> None:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "results/mini_quant")
    records = read_records(folder)
    (folder / "table.md").write_text(render(records))
    plot(records, folder / "accuracy_vs_batch.png")
    print(f"wrote {folder / 'table.md'} and {folder / 'accuracy_vs_batch.png'}")


if __name__ == "__main__":
    main()

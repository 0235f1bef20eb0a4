"""The comparison's table and plot from scripts/compare_sweep.py's records (results/compare/runs.jsonl).

One row per (task, query-aware, policy, compression ratio), its newest ok record: accuracy with its 95% bootstrap
interval (niah: string_match_all; CNN/DM: ROUGE-2), peak KV, the KV held during decode (mean over decode steps, and
as a share of the full cache's on the same prompts), prefill time with the scoring passes inside it, decode time.
A summary beside it: one row per policy, its accuracy in each (task, query-aware, ratio) column. Then the
configurations of the sweep (PARTS) not yet recorded, and the commands that run them. The plot puts accuracy
against the KV held during decode (x full), one panel per task and query setting.

    python scripts/compare_report.py [results/compare]   # writes table.md, summary.md, missing.md, accuracy_vs_kv.png
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from kvbench.report import latest  # noqa: E402
from kvbench.results import read_records  # noqa: E402

MIB = 2**20
METRIC = {"niah_single_1": "string_match_all", "cnndm": "rouge2"}
SWEEP = "python scripts/compare_sweep.py --data-dir ../shared/data"
RATIOS = [0.5, 0.75]
# the sweep's parts: (tasks, query-aware, the command's arguments); CNN/DM refuses query-agnostic (no question apart
# from its article)
PARTS = [(["niah1k", "cnndm"], True, ""), (["niah2k"], True, " --tasks niah2k"),
         (["niah1k", "niah2k"], False, " --tasks niah1k,niah2k --agnostic")]
COLUMNS = [(t, a, r) for a, tasks in ((True, ["niah1k", "niah2k", "cnndm"]), (False, ["niah1k", "niah2k"]))
           for t in tasks for r in RATIOS]


def task_key(r: dict) -> str:
    """The sweep's task name of a record: niah1k / niah2k / cnndm."""
    if r["task"] == "cnndm":
        return "cnndm"
    return f"niah{r['config']['task']['context_length'] // 1024}k"


def rows(records: list[dict]) -> dict[tuple[str, bool, str, float | None], dict]:
    """(task, query_aware, policy, ratio) -> its newest ok record."""
    return {(task_key(r), r["query_aware"], r["policy"], r["compression_ratio"]): r
            for r in latest(records) if r["status"] == "ok"}


def metric(r: dict) -> tuple[float, list[float]]:
    name = METRIC[r["task"]]
    return r["metrics"][name], r["metrics"][f"{name}_ci"]


def share(by: dict, key: tuple, field: str) -> float | None:
    full = by.get((key[0], key[1], "full", None))
    return None if full is None else by[key][field] / full[field]


def order(key: tuple) -> tuple:
    task, aware, policy, ratio = key
    return (["niah1k", "niah2k", "cnndm"].index(task), not aware, ratio or 0.0, policy != "full", policy)


def render(records: list[dict]) -> str:
    by = rows(records)
    lines = ["| task | query-aware | policy | ratio | accuracy [95% CI] | peak KV MiB | decode KV mean MiB (x full) "
             "| prefill s (scoring passes) | decode s |", "|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(by, key=order):
        r = by[key]
        m, (lo, hi) = metric(r)
        x = share(by, key, "decode_kv_bytes_mean")
        score = f" ({r['score_pass_s']:.1f})" if r.get("score_pass_s") else ""
        lines.append(f"| {key[0]} ({METRIC[r['task']]}) | {'yes' if key[1] else 'no'} | `{key[2]}` | "
                     f"{'-' if key[3] is None else key[3]} | {m:.3f} [{lo:.3f}, {hi:.3f}] | "
                     f"{r['peak_kv_bytes'] / MIB:.1f} | {r['decode_kv_bytes_mean'] / MIB:.1f} "
                     f"({'-' if x is None else f'{x:.2f}'}) | {r['prefill_s']:.1f}{score} | {r['decode_s']:.1f} |")
    return "\n".join(lines) + "\n"


def missing(records: list[dict], tasks: list[str], ratios: list[float], aware: bool = True) -> list[tuple]:
    """The sweep's configurations (compare_sweep.configurations) with no ok record yet."""
    from compare_sweep import configurations
    from methods_cost import policies

    by = rows(records)
    return [c for c in configurations(tasks, ratios, policies(None)) if (c[0], aware, c[1], c[2]) not in by]


def render_summary(records: list[dict]) -> str:
    """Two tables (query-aware, query-agnostic), one row per policy: its accuracy in each (task, ratio) column (the
    full cache's in every column of its task), "-" where not recorded."""
    by = rows(records)
    names = ["full", *sorted({k[2] for k in by if k[2] != "full"})]
    tables = []
    for aware in (True, False):
        cols = [(t, r) for t, a, r in COLUMNS if a == aware]
        head = ["query-aware" if aware else "query-agnostic", *[f"{t} {r}" for t, r in cols]]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for name in names:
            cells = []
            for t, r in cols:
                rec = by.get((t, aware, name, None if name == "full" else r))
                cells.append("-" if rec is None else f"{metric(rec)[0]:.2f}")
            lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
        tables.append("\n".join(lines) + "\n")
    return "\n".join(tables)


def render_missing(records: list[dict]) -> str:
    """What the page lists as not yet run, part by part, with the command that completes each part."""
    lines = []
    for tasks, aware, args in PARTS:
        left = missing(records, tasks, RATIOS, aware)
        done = sum(1 for k in rows(records) if k[0] in tasks and k[1] == aware)
        what = f"{'query-aware' if aware else 'query-agnostic'} configurations on {', '.join(tasks)}"
        lines.append(f"- {done} of {done + len(left)} {what} are recorded: `{SWEEP}{args}`")
        groups: dict[tuple, list[str]] = {}
        for task, policy, ratio in left:
            groups.setdefault((task, ratio), []).append(policy)
        lines += [f"    - not yet run: {task} at ratio {'- (full cache)' if ratio is None else ratio}: "
                  + ", ".join(f"`{p}`" for p in names) for (task, ratio), names in groups.items()]
    lines += ["", "Each command skips what is recorded: run again, it completes its part. CNN/DM has no question "
              "apart from its article: query-agnostic is refused there (one line)."]
    return "\n".join(lines) + "\n"


def plot(records: list[dict], out: Path) -> None:
    """One panel per (task, query setting) recorded: accuracy against the KV held during decode (x full)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = rows(records)
    panels = [(t, a) for a in (True, False) for t in ("niah1k", "niah2k", "cnndm") if any(k[0] == t and k[1] == a
                                                                                           for k in by)]
    names = sorted({k[2] for k in by})
    colour = {n: plt.get_cmap("tab20")(i % 20) for i, n in enumerate(names)}
    cols = 3
    n_rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(n_rows, cols, figsize=(6.0 * cols, 4.6 * n_rows), squeeze=False)
    for ax, (task, aware) in zip(axes.flat, panels, strict=False):
        for key in sorted(by, key=order):
            if key[0] != task or key[1] != aware:
                continue
            m, (lo, hi) = metric(by[key])
            x = share(by, key, "decode_kv_bytes_mean")
            marker = {None: "*", 0.5: "o", 0.75: "^"}.get(key[3], "s")
            ax.errorbar([x], [m], yerr=[[m - lo], [hi - m]], fmt=marker, color=colour[key[2]], capsize=2, alpha=0.8,
                        label=key[2] if key[3] in (None, 0.5) else None)
        ax.set_xlabel("KV held during decode (mean, x full cache)")
        ax.set_ylabel(f"{METRIC['cnndm' if task == 'cnndm' else 'niah_single_1']} (95% CI)")
        ax.set_title(f"{task}, {'query-aware' if aware else 'query-agnostic'} (o: ratio 0.5, ^: 0.75, *: full)")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    seen = dict(zip(labels, handles, strict=True))
    fig.legend(list(seen.values()), list(seen), fontsize=7, ncol=1, loc="upper left", bbox_to_anchor=(1.0, 0.98))
    fig.tight_layout()
    fig.savefig(out, dpi=110, bbox_inches="tight")


def main() -> None:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "results" / "compare")
    records = read_records(folder)
    (folder / "table.md").write_text(render(records))
    (folder / "summary.md").write_text(render_summary(records))
    (folder / "missing.md").write_text(render_missing(records))
    plot(records, folder / "accuracy_vs_kv.png")
    print(render_summary(records))
    print(render_missing(records))


if __name__ == "__main__":
    main()

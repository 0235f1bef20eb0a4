"""Needle heatmaps: the RULER score per needle depth x context length, one per policy, and a side-by-side grid.

From runs.jsonl: the latest ok record of each configuration whose task places its needles at a set depth
(`task.depth`, kvbench-needle's sweep), grouped by model, task, query_aware and method (policy, schedule
and budget); a cell is the run's mean score (RULER's string_match_all: 1 = every needle value recalled).
Written as `plots/needle_<slug>.png` per method and `plots/needle_grid.png` with all of them, and listed
in tables.md with the cells as a table.
"""

from __future__ import annotations

import re
from pathlib import Path

from kvbench.report.grouping import latest
from kvbench.report.rows import default_schedules, method_of, metric_key


def _task_cfg(rec: dict) -> dict:
    return (rec.get("config") or {}).get("task") or {}


def label(rec: dict, defaults: dict[str, str]) -> str:
    """Method, its budget and, for a query-agnostic run, `(QA-free)`: e.g. `H2O cr=0.5`."""
    text = method_of(rec, defaults)
    if rec.get("compression_ratio") is not None:
        text += f" cr={rec['compression_ratio']:g}"
    elif rec.get("kv_ratio") is not None:
        text += f" ratio={rec['kv_ratio']:g}"
    elif rec.get("kv_size") is not None:
        text += f" kv={rec['kv_size']}"
    if rec.get("query_aware") is False:
        text += " (query-agnostic)"
    return text


def cells(records: list[dict]) -> dict[tuple[str, str, str], dict[tuple[float, int], float]]:
    """(model, task, method label) -> {(depth, context_length): score} over the depth-swept records."""
    swept = [r for r in latest(records) if r.get("status") == "ok" and _task_cfg(r).get("depth") is not None
             and _task_cfg(r).get("context_length") is not None and r.get("metrics")]
    if not swept:
        return {}
    metric = metric_key(swept)
    defaults = default_schedules()
    out: dict = {}
    for r in swept:
        value = (r.get("metrics") or {}).get(metric)
        if value is None:
            continue
        t = _task_cfg(r)
        out.setdefault((r.get("model"), r.get("task"), label(r, defaults)), {})[
            (float(t["depth"]), int(t["context_length"]))] = float(value)
    return out


def slug(key: tuple[str, str, str]) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", "_".join(str(k) for k in key)).strip("_").lower()


def _draw(ax, grid: dict[tuple[float, int], float], title: str):
    import numpy as np

    depths = sorted({d for d, _ in grid})
    lengths = sorted({n for _, n in grid})
    z = np.full((len(depths), len(lengths)), np.nan)
    for (d, n), v in grid.items():
        z[depths.index(d), lengths.index(n)] = v
    im = ax.imshow(z, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto", origin="upper")
    ax.set_xticks(range(len(lengths)), [str(n) for n in lengths], fontsize=7)
    ax.set_yticks(range(len(depths)), [f"{d:.0%}" for d in depths], fontsize=7)
    ax.set_xlabel("context length (tokens)", fontsize=8)
    ax.set_ylabel("needle depth", fontsize=8)
    ax.set_title(title, fontsize=8)
    for i in range(len(depths)):
        for j in range(len(lengths)):
            if not np.isnan(z[i, j]):
                ax.text(j, i, f"{z[i, j]:.2f}", ha="center", va="center", fontsize=6)
    return im


def write(records: list[dict], out: Path) -> dict[str, Path]:
    """The heatmap PNGs (one per method, and the grid); {} when no record sweeps the depth."""
    data = cells(records)
    if not data:
        return {}
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for key, grid in sorted(data.items()):
        fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len({n for _, n in grid}), 1.2 + 0.45 * len({d for d, _ in grid})))
        im = _draw(ax, grid, f"{key[2]} - {key[1]} ({key[0]})")
        fig.colorbar(im, ax=ax, fraction=0.05)
        fig.tight_layout()
        path = out / f"needle_{slug(key)}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written[f"needle_{slug(key)}"] = path
    keys = sorted(data)
    cols = min(4, len(keys))
    rows = (len(keys) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols + 0.8, 3.0 * rows), squeeze=False, layout="constrained")
    for ax, key in zip(axes.flat, keys, strict=False):
        im = _draw(ax, data[key], f"{key[2]}\n{key[1]} ({key[0]})")
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    fig.colorbar(im, ax=axes, fraction=0.02)
    path = out / "needle_grid.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    written["needle_grid"] = path
    return written


def markdown(records: list[dict], plots: dict[str, Path], rel: str = "plots") -> str:
    """tables.md's section: per method, the score by depth (rows) and context length (columns)."""
    data = cells(records)
    if not data:
        return ""
    parts = ["## Needle heatmaps", "",
             "RULER score (share of needle values recalled) per needle depth and context length.", ""]
    if "needle_grid" in plots:
        parts += [f"![needle heatmaps]({rel}/needle_grid.png)", ""]
    for key, grid in sorted(data.items()):
        lengths = sorted({n for _, n in grid})
        parts += [f"### {key[2]} - {key[1]} ({key[0]})", "",
                  "| depth | " + " | ".join(str(n) for n in lengths) + " |",
                  "|---|" + "---|" * len(lengths)]
        for d in sorted({d for d, _ in grid}):
            row = [f"{grid[(d, n)]:.3f}" if (d, n) in grid else "-" for n in lengths]
            parts.append(f"| {d:.0%} | " + " | ".join(row) + " |")
        parts.append("")
    return "\n".join(parts)

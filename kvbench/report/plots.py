"""The report's plots, per table: metric vs throughput, the searched batch sizes, peak memory, agreement."""

from __future__ import annotations

from pathlib import Path

from kvbench.report.rows import PLOTS, _int, method_rank
from kvbench.report.tables import Table

GiB = 2**30




def limit_gb(record: dict) -> float | None:
    """The record's memory limit (GiB): `memory.limit_gb`, named `memory.budget_gb` in records made before."""
    mem = (record.get("config") or {}).get("memory") or {}
    return mem.get("limit_gb", mem.get("budget_gb"))


def series_key(k: tuple[str, int | None]) -> tuple:
    return (method_rank(k[0]), k[1] or 0)


def series_label(k: tuple[str, int | None]) -> str:
    return k[0] if k[1] is None else f"{k[0]} kv={k[1]}"


def plot_table(t: Table, out: Path) -> list[str]:
    """The table's PNGs (those it has data for); returns their kinds (keys of PLOTS)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    methods = sorted({m for m, _ in t.records}, key=method_rank)
    colour = {m: plt.get_cmap("tab10")(i % 10) for i, m in enumerate(methods)}
    written = []

    def save(fig, ax, kind):
        ax.set_title(t.title, fontsize=9)
        fig.tight_layout()
        fig.savefig(out / f"{t.slug}_{PLOTS[kind][0]}", dpi=120)
        plt.close(fig)
        written.append(kind)

    if t.runs:
        fig, ax = plt.subplots(figsize=(6.4, 4.4))
        for m in methods:
            rows = [r for r in t.runs if r.method == m]
            if rows:
                ax.scatter([r.tok_s for r in rows], [r.metric for r in rows], color=colour[m], label=m, zorder=3)
            bars = [r for r in rows if r.ci is not None]  # 95% bootstrap intervals
            if bars:
                ax.errorbar([r.tok_s for r in bars], [r.metric for r in bars], fmt="none", ecolor=colour[m],
                            elinewidth=0.8, capsize=2, alpha=0.6,
                            yerr=[[r.metric - r.ci[0] for r in bars], [r.ci[1] - r.metric for r in bars]])
            for r in rows:
                text = f"b={r.b}" + ("" if r.kv is None else f" kv={r.kv}")
                ax.annotate(text, (r.tok_s, r.metric), fontsize=6, xytext=(3, 3), textcoords="offset points")
        if t.fkv:
            ax.axhline(t.fkv.metric, color="grey", ls="--", lw=1, label="FKV level")
            ax.axhline(t.near_fkv * t.fkv.metric, color="grey", ls=":", lw=1, label=f"{t.near_fkv:.0%} of FKV")
        ax.set(xlabel="throughput (generated tokens/s, prefill included)", ylabel=t.metric_name)
        ax.legend(fontsize=7)
        save(fig, ax, "accuracy")

    searched = {}  # (method, kv) -> the latest record's search
    for m, r in t.records:
        s = r.get("search") or {}
        if s.get("max_batch_size") is not None:
            searched[(m, r.get("kv_size"))] = s
    if searched:
        keys = sorted(searched, key=series_key)
        values = [searched[k]["max_batch_size"] for k in keys]
        fig, ax = plt.subplots(figsize=(6.4, 1.2 + 0.35 * len(keys)))
        ax.barh([series_label(k) for k in keys], values, color=[colour[k[0]] for k in keys])
        for i, k in enumerate(keys):
            first = searched[k].get("first_oom_batch_size")
            text = f"{values[i]}" + (f" (b={first} OOM)" if first else "")
            ax.annotate(text, (values[i], i), fontsize=7, xytext=(3, 0), textcoords="offset points", va="center")
        ax.invert_yaxis()
        ax.set_xlim(0, max(values + [1]) * 1.35)
        ax.set(xlabel="largest batch size that fits (search)")
        save(fig, ax, "batch")

    mem: dict[tuple, dict[int, tuple[float, bool]]] = {}  # (method, kv) -> batch size -> (GiB, out of memory)
    for m, r in t.records:
        points = mem.setdefault((m, r.get("kv_size")), {})
        for trial in (r.get("search") or {}).get("trials") or []:
            if trial.get("peak_mem_bytes"):
                points[trial["batch_size"]] = (trial["peak_mem_bytes"] / GiB, trial.get("status") == "oom")
        if r.get("peak_mem_bytes") and _int(r.get("batch_size")) is not None:
            points[r["batch_size"]] = (r["peak_mem_bytes"] / GiB, r["status"] == "oom")
    mem = {k: v for k, v in mem.items() if v}
    if mem:
        fig, ax = plt.subplots(figsize=(6.4, 4.4))
        for k in sorted(mem, key=series_key):
            pts = sorted(mem[k].items())
            drawn = ax.plot([b for b, _ in pts], [g for _, (g, _) in pts], marker="o", ms=3, label=series_label(k))
            over = [(b, g) for b, (g, oom) in pts if oom]
            if over:
                ax.scatter([b for b, _ in over], [g for _, g in over], marker="x", s=40, color=drawn[0].get_color(), zorder=3)
        budgets = {limit_gb(r) for _, r in t.records}
        if len(budgets) == 1 and None not in budgets:
            ax.axhline(budgets.pop(), color="grey", ls="--", lw=1, label="memory.limit_gb")
        ax.set(xlabel="batch size", ylabel="peak memory, GiB (x: out of memory)")
        ax.set_ylim(bottom=0)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend(fontsize=7)
        save(fig, ax, "memory")

    agreeing = [(r, t.vs_fkv[r.run_id].agreement) for r in t.runs
                if r.run_id in t.vs_fkv and t.vs_fkv[r.run_id].agreement and r.kv is not None]
    if agreeing:
        fig, ax = plt.subplots(figsize=(6.4, 4.4))
        for m in methods:
            pts = sorted(((r.kv, a) for r, a in agreeing if r.method == m), key=lambda p: p[0])
            if not pts:
                continue
            kv = [k for k, _ in pts]
            prefix = [a["prefix"] for _, a in pts]
            ax.errorbar(kv, prefix, yerr=[[a["prefix"] - a["prefix_ci"][0] for _, a in pts],
                                          [a["prefix_ci"][1] - a["prefix"] for _, a in pts]],
                        color=colour[m], marker="o", ms=4, capsize=2, label=f"{m}: tokens as FKV's until divergence")
            ax.plot(kv, [a["exact"] for _, a in pts], color=colour[m], ls=":", marker="x", ms=4,
                    label=f"{m}: outputs identical")
        ax.set(xlabel="kv size (pairs kept per head)", ylabel="agreement with FKV (mean over samples)")
        ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=7)
        save(fig, ax, "agreement")
    return written

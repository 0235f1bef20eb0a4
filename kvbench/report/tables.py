"""One table per setting: its runs, OOM batches, the paper's picks, the pairing with FKV, its markdown."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from kvbench import compare
from kvbench.report.grouping import differences, group_key, latest, unusable
from kvbench.report.rows import (
    METRICS,
    PLOTS,
    Row,
    _int,
    _number,
    budget_of,
    default_schedules,
    line,
    method_of,
    method_rank,
    metric_key,
    order,
    with_ci,
)


@dataclass
class Table:
    """One model x task x samples x generation length: its runs, OOM batches and picks."""

    key: tuple
    metric: str | None
    runs: list[Row]
    ooms: list[Row]
    records: list[tuple[str, dict]]  # (method, record)
    near_fkv: float
    differs: str = ""  # what this table's setting has that others of its model and task do not
    unique: bool = True  # the only table of its model, task, samples and length (short slug)
    vs_fkv: dict[str, compare.VsFKV] = field(default_factory=dict)  # run_id -> paired comparison with FKV
    lengths: dict[str, dict] = field(default_factory=dict)  # run_id -> output-length summary

    @property
    def title(self) -> str:
        model, task, n, new = self.key[:4]
        head = f"{model} · {task} · {n} samples · {new} new tokens · {self.key[5]} attention"
        if json.loads(self.key[4]).get("mode") == "serve":  # continuous batching, not static batches
            head += " · serving mode"
        return head + (f" · {self.differs}" if self.differs else "")

    @property
    def slug(self) -> str:
        model, task, n, new = self.key[:4]
        attention = self.key[5]
        suffix = "" if attention in ("sdpa", "auto") else f"_{attention}"  # the names plots had before backends
        tag = "" if self.unique else "_" + hashlib.sha1(self.key[4].encode()).hexdigest()[:8]
        return f"{model}_{task}_n{n}_new{new}{suffix}{tag}".replace("/", "-")

    @property
    def metric_name(self) -> str:
        return METRICS.get(self.metric, self.metric or "metric")

    def fastest(self, rows: list[Row]) -> Row | None:
        return max(rows, key=lambda r: (r.tok_s, -r.b)) if rows else None

    @property
    def fkv(self) -> Row | None:
        return self.fastest([r for r in self.runs if r.method == "FKV"])

    def first_oom(self, row: Row) -> Row | None:
        """The smallest known OOM batch above `row` for the same method and kv."""
        above = [o for o in self.ooms if o.method == row.method and (o.kv, o.budget) == (row.kv, row.budget)
                 and o.b > row.b]
        return min(above, key=lambda o: o.b) if above else None

    def summary(self) -> list[tuple[str, Row]]:
        """(label, row) in the paper's order: ED, FKV, then each other method's picks."""
        out = []
        for m in ("ED", "FKV"):
            best = self.fastest([r for r in self.runs if r.method == m])
            ooms = [o for o in self.ooms if o.method == m]
            if best:
                out.append((m, best))
            elif ooms:  # nothing fits (e.g. a search at a tight budget): its smallest out-of-memory batch
                out.append((m, min(ooms, key=lambda o: o.b)))
        fkv = self.fkv
        if fkv is None:
            return out
        for m in sorted({r.method for r in self.runs} - {"ED", "FKV"}, key=method_rank):
            rows = [r for r in self.runs if r.method == m]
            at_fkv = self.fastest([r for r in rows if r.metric >= fkv.metric])
            near = self.fastest([r for r in rows if r.metric >= self.near_fkv * fkv.metric])
            if at_fkv:  # when it is also the near-FKV pick, say so rather than drop that row silently
                same = f" (also ≥ {self.near_fkv:.0%} FKV)" if near == at_fkv else ""
                out.append((f"{m} ≥ FKV{same}", at_fkv))
            if near and near != at_fkv:
                out.append((f"{m} ≥ {self.near_fkv:.0%} FKV", near))
        return out

    def verdict_cell(self, row: Row) -> str:
        if row.method == "FKV":
            return "reference"
        v = self.vs_fkv.get(row.run_id)
        if v is None or v.diff is None:
            return "-"
        return f"{with_ci(v.diff['mean'], v.diff['ci'], sign='+')}: {v.verdict}"

    def against_fkv(self) -> list[str]:
        """The section pairing every run with the table's FKV run on the same samples (none without data)."""
        fkv = self.fkv
        if not (self.vs_fkv or self.lengths) or fkv is None:
            return []
        n = {v.diff["n"] for v in self.vs_fkv.values() if v.diff}
        lines = [
            f"Against FKV (the FKV run above, b={fkv.b}; paired by sample"
            + (f", {n.pop()} samples" if len(n) == 1 else "") + "; 95% bootstrap intervals):",
            "",
            f"| Method | b | kv | Δ {self.metric_name} | tokens as FKV's until the first divergence"
            " | outputs identical to FKV's | output tokens mean / median / max |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in sorted(self.runs, key=order):
            v = self.vs_fkv.get(r.run_id)
            if r.run_id == fkv.run_id:
                diff = agree = exact = "reference"
            else:
                d = v.diff if v else None
                a = v.agreement if v else None
                diff = with_ci(d["mean"], d["ci"], sign="+") if d else "-"
                agree = with_ci(a["prefix"], a["prefix_ci"], 2) if a else "-"
                exact = with_ci(a["exact"], a["exact_ci"], 2) if a else "-"
            ln = self.lengths.get(r.run_id)
            size = f"{ln['mean']:.1f} / {ln['median']:g} / {ln['max']}" if ln else "-"
            lines.append(line([r.method, str(r.b), r.cells()[2], diff, agree, exact, size]))
        return [*lines, ""]

    def markdown(self, plots: list[str]) -> str:
        """The table's section of tables.md; `plots`: the kinds of PLOTS drawn for it."""
        head = f"| Method | b | kv | {self.metric_name} | tokens/s |\n|---|---:|---:|---:|---:|"
        lines = [f"## {self.title}", ""]
        summary = self.summary()
        paired = bool(self.vs_fkv)  # a column saying whether each pick's paired difference to FKV is 0
        if summary:
            lines += [head.replace(" |\n", " | vs FKV (paired, 95% CI) |\n") + "---|" if paired else head]
            for label, row in summary:
                extra = [self.verdict_cell(row)] if paired else []
                lines.append(line([label, *row.cells()[1:], *extra]))
                oom = None if row.oom else self.first_oom(row)
                if oom:
                    lines.append(line([label, *oom.cells()[1:], *([""] if paired else [])]))
            fkv = self.fkv
            if fkv:
                lines += ["", f"FKV level: {fkv.metric:.3f}; {self.near_fkv:.0%} of it: {self.near_fkv * fkv.metric:.3f}."]
                if fkv.metric <= 0:
                    lines[-1] += (" FKV scores 0, so every run meets its level: the picks above"
                                  " compare throughput only, not accuracy.")
            lines.append("")
        lines += ["All runs:", "", head]
        lines += [line(r.cells()) for r in sorted(self.runs + self.ooms, key=order)]
        lines.append("")
        lines += self.against_fkv()
        lines += [f"![{PLOTS[kind][1]}](plots/{self.slug}_{PLOTS[kind][0]})" for kind in plots]
        return "\n".join(lines).rstrip("\n") + "\n"


def tables(records: list[dict], near_fkv: float, results_dir: str | Path | None = None) -> list[Table]:
    """The tables; with `results_dir`, per-sample data (predictions or scores files) adds intervals,
    paired differences to FKV, agreement and output lengths."""
    defaults = default_schedules()
    cache: dict = {}
    groups: dict[tuple, list[dict]] = {}
    for r in latest(records):
        if unusable(r) is None:
            groups.setdefault(group_key(r), []).append(r)
    differs = differences(list(groups))
    titles = [(k[:4], k[5]) for k in groups]
    out = []
    for key in sorted(groups):
        recs = groups[key]
        metric = metric_key(recs)
        runs, ooms, labelled = [], set(), []
        for r in recs:
            serve = r.get("mode") == "serve"
            m, kv, b = method_of(r, defaults), r.get("kv_size"), 0 if serve else _int(r.get("batch_size"))
            per_prompt = budget_of(r)
            search = r.get("search") or {}
            labelled.append((m, r))
            first = _int(search.get("first_oom_batch_size"))
            if r["status"] == "oom":
                # nothing fitted when the search found no batch size: the oom is its first (smallest) trial
                b = first if search and search.get("max_batch_size") is None else b
                if b is not None:
                    ooms.add(Row(m, b, kv, oom=True, budget=per_prompt))
            elif b is not None and _number(r.get("throughput_tok_s")) and _number((r.get("metrics") or {}).get(metric)):
                samples = compare.load(r, results_dir, cache) if results_dir is not None else None
                ci = compare.metric_ci(r, metric, samples)
                runs.append(Row(m, b, kv, r["metrics"][metric], r["throughput_tok_s"], ci=ci, run_id=r.get("run_id"),
                                serve=serve, budget=per_prompt))
            if first:
                ooms.add(Row(m, first, kv, oom=True, budget=per_prompt))
        t = Table(key, metric, runs, sorted(ooms, key=order), labelled, near_fkv, differs[key],
                  titles.count((key[:4], key[5])) == 1)
        if results_dir is not None:
            pair_with_fkv(t, {r.get("run_id"): r for r in recs}, results_dir, cache)
        out.append(t)
    return out


def pair_with_fkv(t: Table, by_id: dict[str, dict], results_dir, cache: dict) -> None:
    """Fill the table's comparisons with its FKV run and its runs' output lengths."""
    for r in t.runs:
        ln = compare.lengths(by_id[r.run_id], compare.load(by_id[r.run_id], results_dir, cache))
        if ln:
            t.lengths[r.run_id] = ln
    fkv = t.fkv
    if fkv is None:
        return
    ref = compare.load(by_id[fkv.run_id], results_dir, cache)
    for r in t.runs:
        if r.run_id != fkv.run_id:
            v = compare.vs_fkv(compare.load(by_id[r.run_id], results_dir, cache), ref, t.metric)
            if v is not None and (v.diff or v.agreement):
                t.vs_fkv[r.run_id] = v

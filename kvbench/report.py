"""`kvbench-report RESULTS_DIR`: the paper's tables, a CSV of every run and plots, from runs.jsonl.

Writes into RESULTS_DIR (or `--out`):
- `tables.md`: per setting (below) and attention backend (records of `mode: plan` are no runs and
  are left out), the paper's layout (Method, b,
  kv, metric, tokens/s). The summary picks ED's and FKV's fastest runs and, for every other method,
  the fastest run at FKV's metric or above ("BM >= FKV") and at `--near-fkv` of it ("BM >= 96% FKV",
  the paper's second Batch-Max row); "All runs" lists every configuration. A known out-of-memory
  batch is a row "(b=5 OOM)" after the largest run of the same method and kv, as in the paper.
- `runs.csv`: every record of runs.jsonl (errors and repeats included), flattened.
- `plots/*.png`: per table, the metric vs throughput (one point per run, the FKV level as a line),
  the largest batch size the search found per method and kv, and peak memory vs batch size.

Settings are kept apart: one table per setting, the whole resolved config (`record["config"]`) minus
the knobs a table compares (COMPARED: the policy and its hyper-parameters, the batch size, the
search keys, where results, logs and data live), so runs with another n_shot, seed, prompt style,
input cut, ignore_eos, context length, budget or device never share a table, and ED's and FKV's
reference rows come from the same setting only. A heading names what its setting has that other
settings of the same model and task do not (e.g. `task.n_shot=0`). A search where not even the
smallest batch fits is a row "(b=1 OOM)".

Only the latest record of a configuration (its `config_hash`) that ended ok or oom counts; a record
the report cannot use (no policy, no batch size, metrics that are no mapping) is left out and
counted in the header, never a crash. The metric column is ROUGE-2 when a run has it, else accuracy.
Method names: ED extreme decoding-only, FKV full cache, BM Batch-Max; "(P&D)" / "(D)" marks a
policy run under the schedule it does not default to.

Uncertainty (kvbench.stats, per-sample data through kvbench.compare): a metric shows its 95%
bootstrap interval, `0.064 [0.051, 0.078]` (the record's `<metric>_ci`, else rebuilt from the run's
predictions or scores file), with error bars in the plot. When per-sample data is at hand, every
summary pick says whether its paired difference to FKV (same samples, matched by index) is
distinguishable from 0, and a section "Against FKV" lists, per run, that difference with its
interval, how far its generated tokens follow FKV's (the share equal up to the first divergence,
and identical outputs) and its output lengths; a plot shows the agreement against kv size.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from kvbench import compare
from kvbench.config import CONF_DIR, ReproduceConfig, record_hash
from kvbench.results import probe_writable, read_records

METHODS = {"extreme_decode": "ED", "full": "FKV", "batch_max": "BM", "window": "Window", "h2o": "H2O", "tova": "TOVA"}
SCHEDULES = {"prefill_and_decode": "P&D", "decode_only": "D"}
METRICS = {"rouge2": "ROUGE-2", "accuracy": "accuracy"}  # the paper's columns, in order of preference
CSV_FIELDS = (
    "run_id", "config_hash", "started_at", "status", "experiment", "model", "task", "policy", "kv_size",
    "evict_every", "schedule", "batch_size", "n_samples", "max_new_tokens", "seed", "device",
    "throughput_tok_s", "prefill_s", "decode_s", "wall_s", "generated_tokens", "peak_kv_bytes", "peak_mem_bytes",
)
GiB = 2**30
# keys of record["config"] that a table compares (or that say where things live), not its setting
COMPARED = ("policy", "batch_size", "search", "results_dir", "logger", "output", "skip_existing",
            "experiment_name", "reproduce", "data.dir")
log = logging.getLogger("kvbench")


@dataclass(frozen=True)
class Row:
    method: str
    b: int
    kv: int | None
    metric: float | None = None
    tok_s: float | None = None
    oom: bool = False
    ci: tuple[float, float] | None = field(default=None, compare=False)  # the metric's 95% bootstrap interval
    run_id: str | None = field(default=None, compare=False)
    serve: bool = False  # a mode=serve run: no batch size (the scheduler batches), b is 0

    def cells(self) -> list[str]:
        kv = "-" if self.kv is None else str(self.kv)
        if self.oom:
            return [self.method, f"(b={self.b} OOM)", kv, "-", "-"]
        b = "serve" if self.serve else str(self.b)
        return [self.method, b, kv, with_ci(self.metric, self.ci), f"{self.tok_s:.1f}"]


def with_ci(value: float, ci, digits: int = 3, sign: str = "") -> str:
    """`0.064 [0.051, 0.078]`, or the value alone when there is no interval."""
    text = f"{value:{sign}.{digits}f}"
    return text if ci is None else f"{text} [{ci[0]:{sign}.{digits}f}, {ci[1]:{sign}.{digits}f}]"


def default_schedules() -> dict[str, str]:
    """Policy name -> the schedule its conf/policy file runs it under."""
    return {p.stem: OmegaConf.load(p).get("schedule") for p in sorted((CONF_DIR / "policy").glob("*.yaml"))}


def method_of(rec: dict, defaults: dict[str, str]) -> str:
    name = rec["policy"]
    label = METHODS.get(name, name)
    schedule = rec.get("schedule")
    if name not in ("full", "extreme_decode") and schedule and schedule != defaults.get(name, schedule):
        label += f" ({SCHEDULES.get(schedule, schedule)})"
    return label


def metric_key(records: list[dict]) -> str | None:
    keys = {k for r in records for k in (r.get("metrics") or {})}
    return next((k for k in METRICS if k in keys), min(keys) if keys else None)


def latest(records: list[dict]) -> list[dict]:
    """The last ok/oom record of each configuration, in file order."""
    by_hash: dict[str, dict] = {}
    for i, r in enumerate(records):
        if r.get("status") in ("ok", "oom") and r.get("mode") != "plan":  # a plan (kvbench-plan) is no run
            # the identity recomputed from the record (older records hashed device=auto as "auto")
            by_hash[record_hash(r) or r.get("config_hash") or f"#{i}"] = r
    return list(by_hash.values())


def attention_of(rec: dict) -> str:
    """The attention backend the run asked for (gen.attention), which tables are kept apart by.

    `auto` stays `auto`: it resolves per policy (on CPU `fused` for scored policies, `sdpa` for the
    others, the same tokens), so splitting by the resolved name would put ED and FKV in one table and
    Batch-Max in another. The backend each run really used is its record's `attention` field.
    """
    return str(((rec.get("config") or {}).get("gen") or {}).get("attention") or rec.get("attention") or "auto")


def flat(d, prefix: str = "") -> dict[str, object]:
    """{"a": {"b": 1}} -> {"a.b": 1}."""
    out: dict[str, object] = {}
    for k, v in (d.items() if isinstance(d, dict) else []):
        if isinstance(v, dict) and v:
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def setting(rec: dict) -> dict[str, object]:
    """The record's setting: its resolved config (flattened) minus COMPARED, plus the title fields."""
    config = {k: v for k, v in flat(rec.get("config")).items()
              if not any(k == c or k.startswith(c + ".") for c in COMPARED)}
    return {**config, "model": rec.get("model"), "task": rec.get("task"), "n_samples": rec.get("n_samples"),
            "max_new_tokens": rec.get("max_new_tokens")}


def group_key(rec: dict) -> tuple:
    """(model, task, n_samples, max_new_tokens, the rest of the setting as JSON, attention backend): one table each."""
    s = setting(rec)
    rest = {k: v for k, v in s.items() if k not in TITLE and k != "gen.attention"}  # the backend: resolved, last
    return (str(s["model"]), str(s["task"]), _int(s["n_samples"]) or 0, _int(s["max_new_tokens"]) or 0,
            json.dumps(rest, sort_keys=True, default=str), attention_of(rec))


TITLE = ("model", "task", "n_samples", "max_new_tokens")
SHOWN_ELSEWHERE = ("model.name", "task.n_samples", "gen.max_new_tokens")  # already in the title


def _int(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def unusable(rec: dict) -> str | None:
    """Why the report cannot use this record (None: it can)."""
    if not isinstance(rec.get("policy"), str):
        return "no policy"
    if not isinstance(rec.get("metrics") or {}, dict):
        return "metrics is not a mapping"
    if not isinstance(rec.get("search") or {}, dict):
        return "search is not a mapping"
    if rec.get("status") == "ok" and _int(rec.get("batch_size")) is None and not (rec.get("search") or {}) and (
            rec.get("mode") != "serve"):
        return "no batch size"
    return None


def differences(keys: list[tuple]) -> dict[tuple, str]:
    """Group key -> "k=v, ..." of the setting keys that differ between groups of the same model and task."""
    out = {}
    for key in keys:
        rivals = [k for k in keys if k[:2] == key[:2]]
        mine = json.loads(key[4])
        others = [json.loads(k[4]) for k in rivals if k != key]
        shown = sorted(k for k in set(mine).union(*others)
                       if k not in SHOWN_ELSEWHERE and any(o.get(k) != mine.get(k) for o in others))
        out[key] = ", ".join(f"{k}={json.dumps(mine.get(k), default=str)}" for k in shown)
    return out


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
        above = [o for o in self.ooms if o.method == row.method and o.kv == row.kv and o.b > row.b]
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
            lines.append(line([r.method, str(r.b), "-" if r.kv is None else str(r.kv), diff, agree, exact, size]))
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


def line(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def method_rank(method: str) -> tuple:
    """The paper's order (ED, FKV, BM), then the other methods by name."""
    fixed = ("ED", "FKV", "BM")
    return (fixed.index(method) if method in fixed else len(fixed), method)


def order(r: Row) -> tuple:
    return (method_rank(r.method), r.kv or 0, r.b, r.oom)


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
            search = r.get("search") or {}
            labelled.append((m, r))
            first = _int(search.get("first_oom_batch_size"))
            if r["status"] == "oom":
                # nothing fitted when the search found no batch size: the oom is its first (smallest) trial
                b = first if search and search.get("max_batch_size") is None else b
                if b is not None:
                    ooms.add(Row(m, b, kv, oom=True))
            elif b is not None and _number(r.get("throughput_tok_s")) and _number((r.get("metrics") or {}).get(metric)):
                samples = compare.load(r, results_dir, cache) if results_dir is not None else None
                ci = compare.metric_ci(r, metric, samples)
                runs.append(Row(m, b, kv, r["metrics"][metric], r["throughput_tok_s"], ci=ci, run_id=r.get("run_id"),
                                serve=serve))
            if first:
                ooms.add(Row(m, first, kv, oom=True))
        t = Table(key, metric, runs, sorted(ooms, key=order), labelled, near_fkv, differs[key],
                  titles.count((key[:4], key[5])) == 1)
        if results_dir is not None:
            pair_with_fkv(t, {r.get("run_id"): r for r in recs}, results_dir, cache)
        out.append(t)
    return out


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


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


# ------------------------------------------------------------------------------------------ files
def write_csv(records: list[dict], path: Path) -> None:
    metric_keys = sorted({k for r in records if isinstance(r.get("metrics"), dict) for k in r["metrics"]})
    fields = [*CSV_FIELDS, *(f"metric_{k}" for k in metric_keys), "search_max_batch_size",
              "search_first_oom_batch_size", "error", "predictions_path", *EXTRA_CSV]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in records:
            search = r.get("search") if isinstance(r.get("search"), dict) else {}
            metrics = r.get("metrics") if isinstance(r.get("metrics"), dict) else {}
            w.writerow({
                **{k: r.get(k) for k in (*CSV_FIELDS, "error", "predictions_path")},
                **{f"metric_{k}": v for k, v in metrics.items()},
                "search_max_batch_size": search.get("max_batch_size"),
                "search_first_oom_batch_size": search.get("first_oom_batch_size"),
                **extra_csv(r),
            })


EXTRA_CSV = ("weights", "output_tokens_mean", "output_tokens_median", "output_tokens_max", "scores_path")


def extra_csv(r: dict) -> dict:
    lengths = r.get("output_tokens") or {}
    return {"weights": r.get("weights"), "scores_path": r.get("scores_path"),
            **{f"output_tokens_{k}": lengths.get(k) for k in ("mean", "median", "max")}}


PLOTS = {  # kind -> (file suffix, alt text)
    "accuracy": ("accuracy_vs_throughput.png", "metric vs throughput"),
    "batch": ("max_batch_size.png", "largest batch size per method"),
    "memory": ("peak_memory.png", "peak memory vs batch size"),
    "agreement": ("agreement_vs_kv.png", "agreement with FKV vs kv size"),
}


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
        budgets = {((r.get("config") or {}).get("memory") or {}).get("budget_gb") for _, r in t.records}
        if len(budgets) == 1 and None not in budgets:
            ax.axhline(budgets.pop(), color="grey", ls="--", lw=1, label="memory.budget_gb")
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


def write_report(results_dir: str | Path, out: str | Path | None = None, near_fkv: float | None = None,
                 plots: bool = True) -> dict[str, Path]:
    """Write tables.md, runs.csv and the plots; returns what was written (name -> path)."""
    records = read_records(results_dir)
    out = Path(out or results_dir)
    out.mkdir(parents=True, exist_ok=True)
    near = ReproduceConfig.near_fkv if near_fkv is None else near_fkv
    ts = tables(records, near, results_dir)
    n_err = sum(1 for r in records if r.get("status") == "error")
    n_int = sum(1 for r in records if r.get("status") == "interrupted")
    bad = [(r.get("run_id"), why) for r in records if (why := unusable(r))]
    if bad:
        log.warning("kvbench-report: %d record(s) left out of the tables: %s", len(bad),
                    "; ".join(f"{i}: {why}" for i, why in bad[:10]))
    parts = [
        "# kvbench results",
        "",
        f"{len(records)} records in runs.jsonl"
        + (f" ({n_err} ended with an error: not in the tables, see runs.csv)" if n_err else "")
        + (f" ({n_int} interrupted: not in the tables)" if n_int else "")
        + (f" ({len(bad)} the report cannot use: {', '.join(sorted({w for _, w in bad}))})" if bad else "")
        + ". ED: extreme decoding-only eviction, FKV: full cache, BM: Batch-Max; tokens/s: generated"
        " tokens per second, prefill included.",
        "",
    ]
    written = {}
    for t in ts:
        kinds = plot_table(t, out / "plots") if plots else []
        written.update({f"{t.slug}_{k}": out / "plots" / f"{t.slug}_{PLOTS[k][0]}" for k in kinds})
        parts.append(t.markdown(kinds))
    (out / "tables.md").write_text("\n".join(parts).rstrip("\n") + "\n")
    write_csv(records, out / "runs.csv")
    written.update({"tables.md": out / "tables.md", "runs.csv": out / "runs.csv"})
    return written


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="kvbench-report", description="Tables, a CSV and plots from RESULTS_DIR/runs.jsonl.")
    p.add_argument("results_dir", help="a results directory holding runs.jsonl")
    p.add_argument("--out", help="where to write (default: RESULTS_DIR)")
    p.add_argument("--near-fkv", type=float, default=None,
                   help=f"the near-FKV pick's share of FKV's metric (default {ReproduceConfig.near_fkv})")
    p.add_argument("--no-plots", action="store_true", help="tables and CSV only")
    args = p.parse_args(argv)
    if not (Path(args.results_dir) / "runs.jsonl").is_file():
        p.error(f"{args.results_dir} has no runs.jsonl")
    out = Path(args.out or args.results_dir)
    try:
        probe_writable(out)  # before any file: never a report half written
        written = write_report(args.results_dir, args.out, args.near_fkv, plots=not args.no_plots)
    except OSError as e:
        print(f"kvbench-report: error: cannot write into {out}: {e.strerror or e}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps({k: str(v) for k, v in written.items()}, indent=1))


if __name__ == "__main__":
    main()

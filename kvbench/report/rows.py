"""The report's row model and labels: a run as a table row, method names, the paper's order."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvbench.conf import load_option, options
from kvbench.policies import registry

# one label per registered policy: its class's own `label` (the paper's abbreviations: ED, FKV, BM), else its name
METHODS = {name: vars(cls).get("label") or name for name, cls in registry().items()}
SCHEDULES = {"prefill_and_decode": "P&D", "decode_only": "D"}
# the column titles of known metrics (any other shows its key), in order of preference for records of no known task
METRICS = {"rouge2": "ROUGE-2", "accuracy": "accuracy", "string_match_all": "RULER score",
           "string_match_part": "RULER QA score"}
PLOTS = {  # kind -> (file suffix, alt text)
    "accuracy": ("accuracy_vs_throughput.png", "metric vs throughput"),
    "batch": ("max_batch_size.png", "largest batch size per method"),
    "memory": ("peak_memory.png", "peak memory vs batch size"),
    "agreement": ("agreement_vs_kv.png", "agreement with FKV vs kv size"),
}


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
    budget: str | None = None  # a per-prompt budget instead of kv: "cr=0.5" (compression_ratio), "kv_ratio=0.5"

    def cells(self) -> list[str]:
        kv = (self.budget or "-") if self.kv is None else str(self.kv)
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
    return {name: load_option("policy", name).get("schedule") for name in options("policy")}


def method_of(rec: dict, defaults: dict[str, str]) -> str:
    name = rec["policy"]
    label = METHODS.get(name, name)
    schedule = rec.get("schedule")
    if name not in ("full", "extreme_decode") and schedule and schedule != defaults.get(name, schedule):
        label += f" ({SCHEDULES.get(schedule, schedule)})"
    return label


def task_metric(rec: dict) -> str | None:
    """The primary metric (`Task.metric`) of the task a record ran: the registered task of its name
    (kvbench.tasks.TASKS), else the class its config's `task._target_` names; None when neither is known."""
    from kvbench.tasks import TASKS

    task = TASKS.get(rec.get("task"))
    target = ((rec.get("config") or {}).get("task") or {}).get("_target_") if task is None else None
    if isinstance(target, str):
        try:
            from hydra.utils import get_class

            task = get_class(target)
        except Exception:  # a task class that is gone or cannot be imported here: no metric known
            task = None
    metric = getattr(task, "metric", None)
    return metric if isinstance(metric, str) else None


def metric_key(records: list[dict]) -> str | None:
    """The metric a table shows: its tasks' own (`Task.metric`) when they agree and the records have it, else
    the first of the paper's columns (METRICS) the records have, else their alphabetically first key."""
    keys = {k for r in records for k in (r.get("metrics") or {})}
    own = {task_metric(r) for r in records} & keys
    if len(own) == 1:
        return own.pop()
    return next((k for k in METRICS if k in keys), min(keys) if keys else None)


def line(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def method_rank(method: str) -> tuple:
    """The paper's order (ED, FKV, BM), then the other methods by name."""
    fixed = ("ED", "FKV", "BM")
    return (fixed.index(method) if method in fixed else len(fixed), method)


def order(r: Row) -> tuple:
    return (method_rank(r.method), r.kv or 0, r.budget or "", r.b, r.oom)


def budget_of(rec: dict) -> str | None:
    """A run's per-prompt budget as its kv cell ("cr=0.5", "kv_ratio=0.5", or KVzap's "threshold=-5": no budget, the
    kept share the data's); None for a kv_size or none."""
    for key, shown in (("compression_ratio", "cr"), ("kv_ratio", "kv_ratio")):
        if _number(rec.get(key)):
            return f"{shown}={rec[key]:g}"
    threshold = ((rec.get("config") or {}).get("policy") or {}).get("threshold")
    return f"threshold={threshold:g}" if _number(threshold) else None


def _int(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)

"""Which records count and which table each belongs to: the latest of a configuration, its setting.

Settings are kept apart: one table per setting, the whole resolved config minus the knobs a table
compares (COMPARED); a heading names what its setting has that others of the same model and task do not.
"""

from __future__ import annotations

import json

from kvbench.config import record_hash
from kvbench.report.rows import _int

# keys of record["config"] that a table compares (or that say where things live), not its setting
COMPARED = ("policy", "batch_size", "search", "results_dir", "logger", "output", "skip_existing",
            "experiment_name", "reproduce", "data.dir")


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

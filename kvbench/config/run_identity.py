"""A run's identity: the config keys that change what it computes, and their hash (`config_hash`).

`skip_existing`, sweep resumption and the report find "the same run" by this hash, in records written by
every earlier version of kvbench, so it must never change for a run that computes the same thing. Hence:

- NON_IDENTITY keys (where results go, how they are logged, the protocol and planning settings no single
  run reads) are left out;
- `device` is the resolved kind ("cpu" / "cuda", never "auto" nor "cuda:1"): a GPU sweep never matches
  what a CPU run recorded, nor the reverse;
- legacy rules: a key added after records existed is left out while it holds the value that computes
  what the records before it computed, so those records keep their hash:
  `memory.reserve_gb` at 0 (or null); `memory.limit_gb` hashed under its name before the rename, `budget_gb`; `policy.rerotate` false; `policy.kv_ratio` and
  `policy.compression_ratio` null; `policy.head_budget` uniform and `policy.head_floor` 0.2; `gen.kv_*` (the quantized
  cache's knobs) while `gen.kv_cache_dtype` is auto; all of `serve.*` outside the serve modes; and in them
  `serve.eviction=policy`, the goodput objectives `serve.slo_*` (they change no computation) and
  `serve.limit_cap` in mode=serve (only serve_limits reads it).

The hash is the first 16 hex digits of the SHA-1 of the identity as sorted-key JSON (`default=str`).
A stored record's config is never changed: the rules work on copies.
"""

from __future__ import annotations

import hashlib
import json

from omegaconf import DictConfig, OmegaConf

from kvbench.config.presets import with_presets
from kvbench.config.schema import SERVE_MODES

# keys that do not change what a run computes: left out of its identity hash
NON_IDENTITY = ("results_dir", "logger", "skip_existing", "output", "experiment_name", "reproduce", "plan")


def device_kind(device: str) -> str:
    """The kind of device a run resolves to: "cpu" or "cuda" (device=auto resolved on this machine)."""
    from kvbench.models.loaded import resolve_device

    return resolve_device(device).type


def _identity_of(container: dict, kind: str) -> dict:
    """The identity of a resolved config (a plain dict) run on a device of `kind` (the module's rules)."""
    c = {k: v for k, v in container.items() if k not in NON_IDENTITY}
    c["device"] = kind  # resolved: a GPU sweep never matches what a CPU run recorded (nor the reverse)
    # keys added later, at their neutral value, are left out: records made before them keep their identity
    # (copies: a stored record's config is never changed)
    if isinstance(c.get("memory"), dict):  # memory.limit_gb was memory.budget_gb: hashed under that name
        c["memory"] = {("budget_gb" if k == "limit_gb" else k): v for k, v in c["memory"].items()
                       if not (k == "reserve_gb" and not v)}
    if isinstance(c.get("policy"), dict):  # keys added later, at their defaults, change no identity
        c["policy"] = {k: v for k, v in c["policy"].items()
                       if not (k == "rerotate" and not v) and not (k in ("kv_ratio", "compression_ratio") and v is None)
                       and not (k == "head_budget" and v == "uniform") and not (k == "head_floor" and v == 0.2)}
    if isinstance(c.get("gen"), dict) and c["gen"].get("kv_cache_dtype", "auto") == "auto":  # not quantized: as
        c["gen"] = {k: v for k, v in c["gen"].items() if not k.startswith("kv_")}  # before the knobs existed
    if c.get("mode") not in SERVE_MODES:  # serve.* only matters to the serve modes (older runs keep their hash)
        c.pop("serve", None)
    elif isinstance(c.get("serve"), dict):  # keys added later at their defaults, and goodput's objectives (they
        c["serve"] = {k: v for k, v in c["serve"].items()  # change no computation), change no identity
                      if not (k == "eviction" and v == "policy") and not k.startswith("slo_")
                      and not (k == "limit_cap" and c.get("mode") == "serve")}
    return c


def _hash(identity_: dict) -> str:
    """The first 16 hex digits of the SHA-1 of `identity_` as sorted-key JSON."""
    return hashlib.sha1(json.dumps(identity_, sort_keys=True, default=str).encode()).hexdigest()[:16]


def identity(cfg: DictConfig) -> dict:
    """The resolved config, as it will run (its presets applied: gen.max_new_tokens=null is the task's own
    length), minus keys that do not change what a run computes; `device` is the resolved kind."""
    cfg = with_presets(cfg)
    return _identity_of(OmegaConf.to_container(cfg, resolve=True), device_kind(cfg.device))


def config_hash(cfg: DictConfig) -> str:
    """The run's identity hash, as its record's `config_hash` holds it."""
    return _hash(identity(cfg))


def record_hash(record: dict) -> str | None:
    """`config_hash` recomputed from a stored record: its `config` and the `device` it ran on.

    Equal to the record's own `config_hash` for records written since the hash uses the resolved
    device kind; for older ones (written when `device=auto` was hashed as "auto") it gives what the
    same run hashes to now, so skip_existing still finds them. None when the record lacks the fields.
    """
    c, dev = record.get("config"), record.get("device")
    if not isinstance(c, dict) or not isinstance(dev, str) or not dev:
        return None
    return _hash(_identity_of(c, dev.split(":")[0]))

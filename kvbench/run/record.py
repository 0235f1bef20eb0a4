"""The record: the one JSON line a run (or a capacity plan) leaves in runs.jsonl, and how it is built.

Every record starts with the same stamp (`stamp`): a run id, the configuration's identity hash, when it
started, kvbench's version and the checkout's git commit. `new_record` is a run's record before it runs
(status "error" until the run says otherwise, every measurement None), so a run that fails anywhere still
writes every field; `plan_record` is a `kvbench-plan` record (mode "plan"), whose identity is prefixed
"plan-" so `skip_existing` never takes a plan for a run. Both live here, so the schema has one home.
`memory_fields` and `task_extensions` are the record fields a run fills from the memory account and the
task.
"""

from __future__ import annotations

import datetime as dt
import functools
import subprocess
import uuid
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

import kvbench
from kvbench import memory
from kvbench.config import SERVE_MODES, config_hash
from kvbench.models import weights_format
from kvbench.models.loaded import LoadedModel, resolve_device


@functools.lru_cache(maxsize=1)
def git_sha() -> str | None:
    """The commit of the kvbench checkout (None outside a git checkout, e.g. an installed wheel)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(kvbench.__file__).parent, capture_output=True, text=True, timeout=5
        )
        sha = out.stdout.strip()
        return sha if len(sha) == 40 else None
    except (OSError, subprocess.SubprocessError):
        return None


def stamp(cfg: DictConfig, kind: str | None = None) -> dict:
    """The fields every record starts with: run_id, config_hash, started_at, kvbench_version, git_sha.

    `kind` (e.g. "plan") marks a record that is not a run: it is part of the run id and prefixes the hash,
    so the record never shares a run's identity.
    """
    started = dt.datetime.now(dt.timezone.utc)
    chash = config_hash(cfg)
    tag = f"{kind}-" if kind else ""
    return {
        "run_id": f"{started:%Y%m%d-%H%M%S}-{tag}{chash[:8]}-{uuid.uuid4().hex[:4]}",
        "config_hash": f"{tag}{chash}",
        "started_at": started.isoformat(timespec="seconds"),
        "kvbench_version": kvbench.__version__,
        "git_sha": git_sha(),
    }


def new_record(cfg: DictConfig, policy, task) -> dict:
    """A run's record before it runs: what the config says, every measurement still None."""
    return {
        **stamp(cfg),
        "status": "error",
        "error": None,
        "oom_kind": None,  # with status oom: "accounted" (final) or "measured" (retried once by skip_existing)
        "experiment": cfg.experiment_name,
        "mode": cfg.mode,
        "model": cfg.model.name,
        "weights": weights_format(cfg),
        "task": task.name,
        "query_aware": getattr(task, "query_aware", True),  # false: the context compressed before the question
        "policy": policy.name,
        "kv_size": policy.kv_size,
        "kv_ratio": policy.kv_ratio,
        "compression_ratio": policy.compression_ratio,
        "kv_budget": None,  # {"by": kv_size | kv_ratio, "min", "max", "per_layer"}: the budgets a (layer, sample) held
        "evict_every": policy.evict_every if policy.evicts and cfg.mode not in SERVE_MODES and not policy.once else None,
        "schedule": policy.schedule if policy.evicts else None,
        "batch_size": cfg.batch_size if cfg.mode not in SERVE_MODES else None,  # serve: the scheduler batches
        "n_samples": task.n_samples,
        "max_new_tokens": cfg.gen.max_new_tokens,
        "seed": cfg.seed,
        "device": str(resolve_device(cfg.device)),
        "metrics": {},
        "throughput_tok_s": None,
        "prefill_s": None,
        "decode_s": None,
        "wall_s": None,
        "evict_s": None,
        "attn_stats_s": None,
        "score_pass_s": None,
        "generated_tokens": None,
        "output_tokens": None,
        "peak_kv_bytes": None,
        "decode_kv_bytes_mean": None,  # the KV cache's allocation during decode steps (static: the cache's tensors;
        "decode_kv_bytes_peak": None,  # serve: the pool's pages in use), mean and largest over the steps
        "kv_kept_share": None,  # static: the share of the pairs the tokens brought that the cache held at the end
        "peak_mem_bytes": None,
        "peak_mem_bytes_per_device": None,
        "peak_reserved_bytes_per_device": None,
        "accounted_mem_bytes": None,
        "accounted_mem_bytes_per_device": None,
        "search": None,
        "attention": None,  # the attention backend really used (kvbench.attention.resolve), once the model is loaded
        "model_family": None,  # the model's family and attention kinds (kvbench.models.family), once it is loaded
        "state_bytes_per_sequence": None,  # a hybrid's linear-attention state per sequence (conv + recurrent)
        "compressed_layers": None,  # the decoder layers the policy compressed (windowed layers keep their window)
        "extensions": [],
        "ignored_keys": [],  # policy keys its policy does not use, gen.kv_quant_* unquantized: reset (kvbench.config)
        "notes": [],
        "logger": None,
        "prompts": None,
        "config": OmegaConf.to_container(cfg, resolve=True),
        "predictions_path": None,
        "scores_path": None,
    }


def plan_record(cfg: DictConfig, *, task: str, n_samples: int, device: str, plan: dict) -> dict:
    """A `kvbench-plan` record (mode "plan", status "ok"): the plan's node, model, prompts and rows in `plan`."""
    return {
        **stamp(cfg, kind="plan"),  # never the identity of a run: skip_existing must not take it for one
        "mode": "plan",
        "status": "ok",
        "error": None,
        "experiment": cfg.experiment_name,
        "model": cfg.model.name,
        "task": task,
        "n_samples": n_samples,
        "max_new_tokens": cfg.gen.max_new_tokens,
        "seed": cfg.seed,
        "device": device,
        "plan": plan,
        "config": OmegaConf.to_container(cfg, resolve=True),
    }


def memory_fields(lm: LoadedModel | None, acc: memory.Account | None) -> dict:
    """Record fields: accounted peak, and measured peak (CUDA) or the accounted one (CPU), per device."""
    accounted = acc.per_device() if acc is not None else {}
    devices = memory.cuda_devices(lm.model) if lm is not None else []
    measured = memory.measured_peaks(devices) if devices else accounted
    return {
        "peak_mem_bytes": sum(measured.values()) if measured else None,
        "peak_mem_bytes_per_device": measured or None,
        "peak_reserved_bytes_per_device": memory.reserved_peaks(devices) if devices else None,  # CUDA only
        "accounted_mem_bytes": acc.total if acc is not None else None,
        "accounted_mem_bytes_per_device": accounted or None,
    }


def quant_extensions(q, serve: bool = False) -> list[str]:
    """What a quantized cache (kvbench.quant.qconfig.KVQuant, None: none) changes in a run, for its extensions
    (`serve`: the paged pool's, whose evictions take whole pages: kvbench.serve.run adds its rule)."""
    if q is None:
        return []
    evict = "" if serve else ("; an eviction gathers kept values as they are and re-quantizes each key block whose "
                              "tokens changed")
    return [f"K/V cache stored in {q.bits}-bit codes (KIVI's rule, asymmetric min/max: keys per channel over {q.group} "
            f"tokens, values per token over {q.group} channels; the newest {q.residual} to {q.residual + q.group - 1} "
            f"pairs in the model's dtype); attention and the policy's scores read the pairs dequantized{evict}"]


def task_extensions(task, new_tokens: int) -> list[str]:
    """The task's departures from its published definition (RULER's), a generation length (`new_tokens`,
    gen.max_new_tokens) other than the task's, and a query-agnostic run said as one."""
    ext = list(task.describe().get("extensions", []))
    gen = task.generation_departure(new_tokens)
    if gen:
        ext.append(gen)
    if not getattr(task, "query_aware", True):
        ext.append("task: query_aware=false: the context is compressed before the question is prefilled "
                   "(kvpress's protocol)")
    return ext

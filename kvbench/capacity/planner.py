"""The capacity plan: for each attention backend and policy, the largest batch and b0, and the plan's record.

`plan(cfg)` checks the config (the same `prepare` as every command, then the node), builds the meta
model and places it, takes the prompt lengths, refuses a policy with nothing to compress (every layer
windowed), searches `search.candidates` with the account's trial for each backend of `plan.backends` and
each policy, and appends one record (kvbench.run.record's `plan_record`, mode "plan") to runs.jsonl.
"""

from __future__ import annotations

import time
from dataclasses import replace

from omegaconf import DictConfig

from kvbench import results, search
from kvbench.budgets import head_rule
from kvbench.capacity.account import plan_policies, trial, window_credit
from kvbench.capacity.node import check, node_of
from kvbench.capacity.placement import placed_shape, placement, spec_of
from kvbench.capacity.plan_prompts import prompt_lengths
from kvbench.config import build_task, prepare, search_candidates
from kvbench.config.positions import check_positions, check_task_positions
from kvbench.quant.qconfig import head_dims, kv_quant
from kvbench.run.record import plan_record


def plan_inputs(cfg: DictConfig):
    """(node, spec, meta model, placed ModelShape, prompt lengths, their source) of a checked config."""
    node = node_of(cfg)
    spec = spec_of(cfg, node)
    check_task_positions(cfg, spec.config)  # a RULER context past the model's positions: before its prompts
    lengths, source = prompt_lengths(cfg)
    check_positions(cfg, spec.config, lengths, "task.max_input_tokens" if cfg.plan.prompt_tokens is None
                    else "plan.prompt_tokens")  # before the account replays max_new_tokens decode steps
    model = spec.meta_model()
    shape = placed_shape(model, placement(model, spec, node))
    shape = replace(shape, kv_quant=kv_quant(cfg.gen, head_dim=head_dims(shape)))  # gen.kv_cache_dtype's cache
    return node, spec, model, shape, lengths, source


def plan(cfg: DictConfig) -> dict:
    """Make the plan, append its record, return it."""
    t0 = time.perf_counter()
    prepare(cfg)
    check(cfg)
    node, spec, model, shape, lengths, source = plan_inputs(cfg)
    from kvbench.models.family import check_policy

    for _, policy in plan_policies(cfg):  # a policy with nothing to compress (every layer windowed) is refused
        check_policy(spec.config, policy, max(lengths) + cfg.gen.max_new_tokens)
    candidates = search_candidates(cfg)
    rows = []
    for backend in cfg.plan.backends:
        for method, policy in plan_policies(cfg):
            found = search.search(candidates, trial(shape, node, lengths, policy, backend, cfg))
            best = next((t for t in found.trials if t.batch_size == found.max_batch_size), None)
            rows.append({
                "attention": backend, "method": method, "policy": policy.name, "kv_size": policy.kv_size,
                "max_batch_size": found.max_batch_size, "first_oom_batch_size": found.first_oom_batch_size,
                "peak_bytes": best.peak_mem_bytes if best else None,  # the fullest device's, at the largest batch
                # the KV cache charged is a bound (head_budget=threshold keeps what the data says): at most this
                "kv_upper_bound": bool(policy.evicts and head_rule(policy).data_dependent),
                "trials": [t.__dict__ for t in found.trials],
            })
    n_params = sum(p.numel() for p in model.parameters())
    kv = window_credit(shape, lengths, cfg)
    record = plan_record(cfg, task=build_task(cfg).name, n_samples=len(lengths), device=node.describe(), plan={
        "kv_cache_dtype": cfg.gen.kv_cache_dtype, "node": {"budget_bytes": node.memory_limit, "usable_bytes": node.usable, "reserve_gb": cfg.memory.reserve_gb,
                 "max_memory": node.max_memory},  # `budget_bytes`: the record's field name, kept
        "model": {"dtype": str(spec.dtype).removeprefix("torch."), "parameters": n_params,
                  "weights_bytes": shape.weights, "layers": shape.layers, **kv},
        "prompts": {"source": source, "tokens_max": max(lengths), "tokens_min": min(lengths), "n": len(lengths)},
        "candidates": candidates,
        "rows": rows,
        "seconds": round(time.perf_counter() - t0, 2),
    })
    results.append_record(cfg.results_dir, record)
    return record

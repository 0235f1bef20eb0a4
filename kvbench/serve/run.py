"""One serve run (`kvbench mode=serve`): tokenised task samples -> requests -> engine -> one record.

Called by `kvbench.run.run` after the model, task and policy are built; fills the record
(`mode: serve`, the task metric over completed requests with the task's own scorers, the serving
metrics under `serve`) and returns the prediction rows (with each request's timings). What the static
engine's fields would claim and serve mode does not apply stays null (`batch_size`: the scheduler
batches; `evict_every`: whole blocks go, the fewest that keep a request in budget); `attention` is
what attended (kvbench.serve.paged_attention: `paged_sdpa`, `paged_fused` for scored policies, `paged_flash`).
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from kvbench import memory
from kvbench.errors import ConfigError
from kvbench.models.geometry import model_geometry
from kvbench.quant.qconfig import head_dims, kv_quant
from kvbench.scoring import predictions
from kvbench.serve import metrics, qpool
from kvbench.serve.budgets import RequestBudgets
from kvbench.serve.engine import serve
from kvbench.serve.pool import PagedPool
from kvbench.serve.workload import build_requests


def pool_blocks(cfg: DictConfig, lm, policy, memory_limit: memory.MemoryLimit | None, quant=None) -> int:
    """serve.num_blocks, or what memory.limit_gb leaves after the weights, the model's and the policy's own
    (activations not reserved); a quantized pool (`quant`) counts its blocks in quantized bytes, after its
    full-precision window pages."""
    if cfg.serve.num_blocks is not None:
        return cfg.serve.num_blocks
    geo = model_geometry(lm.model)
    s = cfg.serve
    dims = dict(num_layers=len(geo["layer_devices"]), block_size=s.block_size, num_kv_heads=geo["num_kv_heads"],
                head_dim=geo["head_dim"], dtype=geo["dtype"], track_attention=policy.needs.attention,
                own=len(policy.needs.pair_state) if policy.needs.observes else 0)
    shape = memory.ModelShape.of(lm.model)  # the weights, the model's and the policy's own (KVzap's scorer)
    free = memory_limit.usable - sum(shape.weights.values()) - sum(memory.policy_weights(shape, policy, d)
                                                                   for d in shape.layers)  # reserve_gb: not the pool's
    if quant is None:
        per_block = PagedPool.block_bytes(**dims, rerotate=policy.rerotate and policy.evicts)
    else:
        window = qpool.window_pages_for(num_layers=dims["num_layers"], num_kv_heads=dims["num_kv_heads"],
                                        block_size=s.block_size, residual=quant.residual, max_running=s.max_running)
        free -= qpool.nbytes_for(**dims, num_blocks=0, bits=quant.bits, window_pages=window)
        per_block = qpool.nbytes_for(**dims, num_blocks=1, bits=quant.bits, window_pages=0)
    n = free // per_block
    if n <= 0:
        raise ConfigError("memory.limit_gb", "leaves no room for a single KV block after the weights", memory_limit.gb)
    return int(n)


def extensions(cfg: DictConfig, policy) -> list[str]:
    s = cfg.serve
    ext = [f"serve(block_size={s.block_size}, max_tokens_per_step={s.max_tokens_per_step})"]
    if policy.evicts:
        ext.append(f"serve_block_eviction(block_score={s.block_score}): whole blocks, " + (
            "each layer and KV head its own (pages owned per layer and KV head, as the static engine evicts per head)"
            if RequestBudgets(policy, (1, 1)).per_head else
            "the same blocks in every layer and KV head (the static engine evicts per head)"))
        ext.append("serve_evicts_fewest_blocks: evict_every is not used; " + (
            "the prompt is compressed once, when its prefill ends, to at most its budget in whole blocks"
            if policy.once else "a request evicts the fewest blocks that keep it within its budget"))
        if policy.protect_first % s.block_size:
            ext.append(f"serve_protect_first_rounded_up_to_blocks({policy.protect_first})")
    if cfg.gen.get("kv_cache_dtype", "auto") != "auto":
        ext.append("serve_quantized_pages: a page is its keys' quantization group (G = serve.block_size), quantized "
                   "once when it is full and gen.kv_quant_residual newer pairs follow it; pages leave whole, so "
                   "eviction re-quantizes nothing (the static cache re-groups the key blocks whose tokens changed); "
                   "a preempted request's recompute reads its pairs in other chunks, so it is not exact")
    if s.eviction != "policy":
        ext.append(f"serve.eviction={s.eviction}: OpenVINO GenAI's preset (start area {policy.protect_first}, "
                   f"recent area {policy.protect_recent}, {policy.kv_size} tokens in all, NORM_SUM of H2O's "
                   "accumulated attention, evicting once the prompt is processed)")
    return ext


def execute(cfg: DictConfig, record: dict, lm, policy, task, samples, ids, memory_limit=None) -> list[dict]:
    s = cfg.serve
    policy.prepare(lm.tokenizer, lm.model)  # once per run, as kvbench.engine.generate does (DuoAttention's pattern)
    quant = kv_quant(cfg.gen, head_dim=head_dims(lm.kinds))  # None: K/V in the model's dtype
    num_blocks = pool_blocks(cfg, lm, policy, memory_limit, quant)
    reqs = build_requests(ids, cfg.gen.max_new_tokens, s.rate, cfg.seed)
    out = serve(
        lm.model, reqs, policy, num_blocks=num_blocks, block_size=s.block_size,
        max_tokens_per_step=s.max_tokens_per_step, max_running=s.max_running, block_score=s.block_score,
        eos_token_ids=lm.eos_token_ids, ignore_eos=cfg.gen.ignore_eos, score_chunk=cfg.gen.score_chunk,
        kinds=lm.kinds, kv_quant=quant,
    )
    rows, task_metrics, lengths = predictions(task, samples, ids, [r.output for r in reqs], lm,
                                              cfg.output.save_prompt_ids)
    for row, r in zip(rows, reqs, strict=True):
        row.update(
            arrival_s=r.arrival, ttft_s=r.first_token_at - r.arrival, finished_s=r.finished_at,
            preemptions=r.preemptions, evicted_blocks=r.evicted_blocks,
        )
    summary = metrics.summarise(out, num_blocks, s.block_size, s.slo_ttft_s, s.slo_tpot_s)
    # each request's layer budgets (L,): the mean over its KV heads (adaptive head budgets move pairs between the
    # heads of a layer, never between layers), as the static engine reports a (layer, sample)'s budget
    got = [r.budget.float().mean(1) for r in reqs if r.budget is not None]
    record.update(
        status="ok",
        mode="serve",
        attention=out.attention,
        batch_size=None,
        evict_every=None,
        kv_budget={"by": policy.per_prompt or "kv_size", "min": min(int(b.min()) for b in got),
                   "max": max(int(b.max()) for b in got), "per_layer": any(bool((b != b[:1]).any()) for b in got)}
        if got else None,
        metrics=task_metrics,
        output_tokens=lengths,
        throughput_tok_s=summary["output_tok_s"],
        wall_s=out.wall_s,
        score_pass_s=out.score_pass_s,
        decode_s=None,
        prefill_s=None,
        generated_tokens=summary["output_tokens"],
        peak_kv_bytes=out.peak_kv_bytes,
        decode_kv_bytes_mean=out.decode_kv_bytes[0],
        decode_kv_bytes_peak=out.decode_kv_bytes[1],
        serve=summary,
    )
    record["extensions"] = record.get("extensions", []) + extensions(cfg, policy)
    if s.plot:
        path = Path(cfg.results_dir) / "serve_plots" / f"{record['run_id']}.png"
        metrics.plot(summary, path, f"{record['model']} {record['task']} {record['policy']} kv={record['kv_size'] or 'all'}")
        summary["plot_path"] = str(path)
    return rows


def execute_limits(cfg: DictConfig, record: dict, lm, policy, task, samples, ids, memory_limit=None) -> list[dict]:
    """mode=serve_limits: OpenVINO's two limit checks (kvbench.serve.limits) on the task's prompt lengths,
    for this pool, policy and schedule; no model is loaded (`lm`, `samples` and `ids` are None)."""
    from kvbench.config.preflight import model_config, prompt_lengths
    from kvbench.serve.block_evict import BlockRule
    from kvbench.serve.limits import Pool, fewest_sequences_to_fill, limits_shape, longest_generation

    s = cfg.serve
    lengths = prompt_lengths(cfg)
    rule = BlockRule.of(policy, s.block_size)
    pool = Pool(s.num_blocks, s.block_size, s.max_tokens_per_step, s.max_running, limits_shape(policy, lambda: getattr(model_config(cfg), "num_hidden_layers", 1)))
    record.update(
        status="ok", mode="serve_limits", batch_size=None, evict_every=None,
        prompts={"n": len(lengths), "tokens_min": min(lengths), "tokens_max": max(lengths),
                 "tokens_mean": round(sum(lengths) / len(lengths), 1)},
        serve_limits={
            "num_blocks": s.num_blocks, "block_size": s.block_size,
            "longest_generation": longest_generation(max(lengths), rule, pool, s.limit_cap, policy),
            "fewest_sequences_to_fill": fewest_sequences_to_fill(lengths, cfg.gen.max_new_tokens, rule, pool, policy),
        },
    )
    record["extensions"] = record.get("extensions", []) + extensions(cfg, policy)
    return []


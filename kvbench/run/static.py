"""mode=run: static batches through kvbench.engine, then scores; the batch size fixed or searched.

The batch size is `batch_size` (clamped to the data's size: `clamp_batch_size`), or with
`search.max_batch=true` the largest that fits, found by kvbench.search (`search_batch_size`, which
records the search; `search.only=true` records it and stops). `execute` generates, scores and fills the
record's measurements (timings, the KV budgets held, the memory peaks).
"""

from __future__ import annotations

import logging

from omegaconf import DictConfig

from kvbench import engine, memory, search
from kvbench.attention import resolve_backend
from kvbench.budgets import head_rule
from kvbench.errors import OutOfMemory
from kvbench.models.loaded import LoadedModel
from kvbench.quant.qconfig import head_dims, kv_quant
from kvbench.run.record import memory_fields
from kvbench.scoring import predictions

log = logging.getLogger("kvbench")


def warmup_of(cfg: DictConfig, model) -> bool:
    """gen.warmup, or when null: on CUDA (lazy init, cuBLAS setup, flash's first call kept out of the timings)."""
    w = cfg.gen.get("warmup")
    return bool(w) if w is not None else model.device.type == "cuda"


def kv_quant_of(cfg: DictConfig, lm: LoadedModel):
    """gen.kv_cache_dtype's quantized cache (kvbench.quant.qconfig.KVQuant), None for the model's dtype."""
    return kv_quant(cfg.gen, head_dim=head_dims(lm.kinds))


def question_tokens(task, lm: LoadedModel, samples, ids) -> list[int] | None:
    """Query-agnostic runs (task.query_aware=false): each prompt's question tokens, prefilled after compression."""
    if getattr(task, "query_aware", True):
        return None
    return [task.question_tokens(lm.tokenizer, s, x) for s, x in zip(samples, ids, strict=True)]


def execute(
    cfg: DictConfig, record: dict, lm: LoadedModel, policy, task, samples, ids, batch_size: int,
    memory_limit: memory.MemoryLimit | None = None,
) -> list[dict]:
    """Generate, score and fill `record`; returns the prediction rows."""
    memory.reset_peaks(memory.cuda_devices(lm.model))
    out = engine.generate(
        lm.model,
        lm.tokenizer,
        ids,
        policy,
        batch_size=batch_size,
        max_new_tokens=cfg.gen.max_new_tokens,
        eos_token_ids=lm.eos_token_ids,
        ignore_eos=cfg.gen.ignore_eos,
        prefill_chunk=cfg.gen.prefill_chunk,
        score_chunk=cfg.gen.score_chunk,
        progress=True,
        memory_limit=memory_limit,
        warmup=warmup_of(cfg, lm.model),
        attention=cfg.gen.attention,
        question_tokens=question_tokens(task, lm, samples, ids),
        kinds=lm.kinds,
        kv_quant=kv_quant_of(cfg, lm),
    )
    rows, metrics, lengths = predictions(task, samples, ids, out.token_ids, lm, cfg.output.save_prompt_ids)
    record.update(
        status="ok",
        metrics=metrics,
        output_tokens=lengths,
        throughput_tok_s=out.throughput_tok_s,
        prefill_s=out.prefill_s,
        decode_s=out.decode_s,
        wall_s=out.wall_s,
        evict_s=out.evict_s,
        attn_stats_s=out.attn_stats_s,
        score_pass_s=out.score_pass_s,
        generated_tokens=out.generated_tokens,
        peak_kv_bytes=out.peak_kv_bytes,
        decode_kv_bytes_mean=out.decode_kv_bytes_mean,
        decode_kv_bytes_peak=out.decode_kv_bytes_peak if out.decode_steps else None,
        kv_kept_share=out.kv_kept_share,
        kv_budget=None if out.budget_min is None or head_rule(policy).data_dependent else {  # a threshold: no budget
            "by": policy.per_prompt or "kv_size",
            "min": out.budget_min, "max": out.budget_max, "per_layer": out.budget_per_layer},
        **memory_fields(lm, out.accounted),
    )
    if out.accounted is not None and out.accounted.upper_bound:
        record["notes"].append("accounted_mem_bytes is an upper bound (head_budget=threshold: the pairs kept depend on "
                               "the data, kv_kept_share says how many; the cache held at most that bound)")
    longest = max(map(len, ids)) + cfg.gen.max_new_tokens
    if out.budget_min is not None and out.budget_min >= longest:  # the cache is sized by the sequences
        record["notes"].append(f"the budget ({out.budget_min} pairs or more) holds every sequence whole (at most "
                               f"{longest} tokens): nothing was evicted, and the cache held the full cache's slots")
    return rows


def search_batch_size(cfg: DictConfig, record: dict, lm: LoadedModel, policy, ids, memory_limit) -> int:
    """search.max_batch: record the search, return the batch size it found (OutOfMemory if none fits).

    When nothing fits, the record's batch size is the smallest one tried (the one that ran out).
    """
    result = search.max_batch(cfg, lm, policy, ids, memory_limit)
    record.update(search=result.to_record(), batch_size=result.max_batch_size or result.first_oom_batch_size)
    if result.max_batch_size is None:
        kind = result.trials[-1].oom_kind  # the smallest candidate's trial (the search stops there)
        raise OutOfMemory(f"search: not even batch size {result.first_oom_batch_size} fits", kind=kind)
    best = next(t for t in result.trials if t.batch_size == result.max_batch_size)  # a search.only record's peak;
    record.update(peak_mem_bytes=best.peak_mem_bytes, accounted_mem_bytes=best.accounted_mem_bytes)  # a run's replaces it
    return result.max_batch_size


def clamp_batch_size(record: dict, batch_size: int, n: int) -> int:
    """A fixed batch larger than the data runs (and is recorded) at the data's size, with a warning."""
    if batch_size > n:
        note = f"batch_size={batch_size} is larger than the {n} samples: ran and recorded batch size {n}"
        log.warning(note)
        record["notes"].append(note)
        batch_size = n
    record["batch_size"] = batch_size
    return batch_size


def run_static(cfg: DictConfig, record: dict, lm: LoadedModel, policy, task, samples, ids, memory_limit) -> list[dict]:
    """mode=run: static batches (a fixed batch size, or the largest the search finds), then scores."""
    record["attention"] = resolve_backend(cfg.gen.attention, lm.model, policy.needs.attention,
                                          head_rule(policy).uneven or kv_quant_of(cfg, lm) is not None, lm.kinds)
    batch_size = clamp_batch_size(record, cfg.batch_size, len(ids))
    if cfg.search.max_batch:
        batch_size = search_batch_size(cfg, record, lm, policy, ids, memory_limit)
    if cfg.search.max_batch and cfg.search.only:
        record["status"] = "ok"
        return []
    return execute(cfg, record, lm, policy, task, samples, ids, batch_size, memory_limit)

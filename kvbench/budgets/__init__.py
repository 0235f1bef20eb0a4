"""Budgets: how many KV pairs each (layer, sample, KV head) of a batch may hold; every budget question is answered
here (a "budget" is always a count of KV pairs; memory is a limit, kvbench.memory).

    knobs.py           the arithmetic of a policy's budget knobs (kv_size, per-prompt shares, min_budget, keep,
                       protected recent pairs, capacities), pure functions of the knobs
    rule.py            budget rules: `HeadRule` (a layer's pairs over its KV heads, `policy.head_budget`) and
                       `LayerRule` (a sample's budget over its layers, `policy.layer_budget`), found by name
    uniform_heads.py, adaptive_heads.py, global_heads.py, layerwise_heads.py, pattern_heads.py, threshold_heads.py
                       the head rules: uniform; AdaKV's split by score; one ranking over a sample's layer x head
                       table (KVzip's global) or per layer; DuoAttention's fixed pattern (streaming heads keep sink +
                       recent); DMS's threshold (out of the newest window, a score below it goes; counts by data)
    uniform_layers.py, pyramid_layers.py, chunk_layers.py, streaming_layers.py   the layer rules: uniform;
                       PyramidKV's pyramid; ChunkKV's whole chunks; DuoAttention's streaming window
    room.py            `Budgets`, the (layer x sample x KV head) counts of one batch, read by the cache, the schedule
                       and the memory account
    question.py        query-agnostic runs: the room a compressed context leaves its question

A new rule is one file here (kvbench.budgets.rule says what it answers).
"""

from kvbench.budgets.knobs import (
    AFTER_PREFILL,
    SCHEDULES,
    capacities,
    decode_capacity,
    head_slots,
    is_int,
    keep,
    layer_budgets,
    min_budget,
    recent_pairs,
    sample_budgets,
    validate,
)
from kvbench.budgets.room import Budgets
from kvbench.budgets.rule import HeadRule, LayerRule, head_rule, head_rules, layer_rule, layer_rules

__all__ = ["AFTER_PREFILL", "SCHEDULES", "Budgets", "HeadRule", "LayerRule", "capacities", "decode_capacity",
           "head_rule", "head_rules", "head_slots", "is_int", "keep", "layer_budgets", "layer_rule", "layer_rules",
           "min_budget", "recent_pairs", "sample_budgets", "validate"]

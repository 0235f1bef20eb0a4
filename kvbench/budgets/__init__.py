"""Budgets as their own room: how many pairs each (layer, sample, KV head) of a batch may hold.

    rules.py   the arithmetic of a policy's budget knobs (kv_size, per-prompt shares, min_budget, keep,
               protected recent pairs, capacities), pure functions of the knobs
    adakv.py   AdaKV's allocation rule: a layer's pairs across its KV heads by score (pure)
    room.py    `Budgets`, the (layer x sample x KV head) counts of one batch, set after prefill from attention
               under adaptive head budgets; read by the cache, the schedule and the memory account
"""

from kvbench.budgets import adakv, rules
from kvbench.budgets.room import Budgets
from kvbench.budgets.rules import AFTER_PREFILL, HEAD_BUDGETS, SCHEDULES

__all__ = ["AFTER_PREFILL", "HEAD_BUDGETS", "SCHEDULES", "Budgets", "adakv", "rules"]

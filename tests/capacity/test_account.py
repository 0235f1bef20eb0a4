"""kvbench.capacity.account: a trial probes the b longest prompts (repeated past the data, as the real search's
probe batch), admits b when every device's accounted peak is within its usable memory, and the plan's
policies are ED, FKV and the configured one per kv size."""

from __future__ import annotations

import torch
from hydra import compose, initialize_config_dir

from kvbench import memory
from kvbench.capacity import Node, plan_policies, trial
from kvbench.capacity.account import _worst_batch
from kvbench.config import CONF_DIR
from kvbench.policies import Full

SHAPE = memory.ModelShape(hidden=64, intermediate=128, vocab=300, q_heads=4, kv_heads=2, head_dim=16,
                          dtype=torch.float32, mlp_buffers=3, fused_qkv=False, weights={"cpu": 10_000},
                          layers={"cpu": 2})


def _cfg(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=["model=tiny-llama", "device=cpu", "gen.max_new_tokens=4", *overrides])


def test_the_worst_batch_is_the_longest_prompts_repeated():
    assert _worst_batch([10, 30, 20], 2) == [30, 20]
    assert _worst_batch([10, 30, 20], 5) == [30, 20, 10, 30, 20]


def test_a_batch_fits_up_to_the_last_byte():
    cfg = _cfg()
    lengths = [10, 30, 20]
    peak2 = memory.account(SHAPE, [30, 20], Full(), max_new_tokens=4, prefill_chunk=cfg.gen.prefill_chunk,
                           score_chunk=cfg.gen.score_chunk, attention="sdpa").total
    for usable, verdicts in ((peak2, ("ok", "ok", "oom")), (peak2 - 1, ("ok", "oom", "oom"))):
        node = Node(usable={"cpu": usable}, memory_limit={"cpu": usable}, max_memory=None)
        run = trial(SHAPE, node, lengths, Full(), "sdpa", cfg)
        assert tuple(run(b).status for b in (1, 2, 3)) == verdicts
    assert trial(SHAPE, node, lengths, Full(), "sdpa", cfg)(2).peak_mem_bytes == peak2


def test_the_policies_a_plan_compares():
    pols = plan_policies(_cfg("policy=batch_max", "policy.evict_every=8", "plan.kv_sizes=[32,64]"))
    assert [(m, p.name, p.kv_size) for m, p in pols] == [("ED", "extreme_decode", 2), ("FKV", "full", None),
                                                          ("BM", "batch_max", 32), ("BM", "batch_max", 64)]
    assert [m for m, _ in plan_policies(_cfg("policy=full"))] == ["ED", "FKV"]

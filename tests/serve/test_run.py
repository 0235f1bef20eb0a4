"""mode=serve from the command line: bad serve.* values stop in one line (exit 2) before a model loads;
a good run writes one record with `mode: serve`, its serving metrics, predictions and a plot."""

from __future__ import annotations

import sys

import pytest

from kvbench import cli
from kvbench import run as kvrun
from kvbench.results import read_jsonl, read_records
from kvbench.serve.metrics import percentiles
from kvbench.serve.workload import arrivals
from tests.conftest import assert_one_line_exit_2

BM = "mode=serve policy=batch_max policy.kv_size=64 policy.evict_every=16"
BAD = {
    f"{BM} serve.block_size=24": "serve.block_size",  # does not divide kv_size
    f"{BM} serve.num_blocks=3": "serve.num_blocks",  # pool smaller than one request's budget
    "mode=serve serve.rate=0": "serve.rate",
    "mode=serve serve.rate=-2.5": "serve.rate",
    "serve.block_size=0": "serve.block_size",
    "mode=serve serve.max_tokens_per_step=0": "serve.max_tokens_per_step",
    "mode=serve serve.block_score=max": "serve.block_score",
    "mode=serve serve.num_blocks=null": "serve.num_blocks",
    # a sink block (16) + the recent half (16) + one block for new tokens (16) > 32
    "mode=serve policy=h2o policy.kv_size=32 serve.block_size=16 policy.protect_first=1": "policy.kv_size",
    "mode=nope": "mode",
    # a per-prompt budget below a request's protected areas plus one block: it could never feed a token
    "mode=serve policy=h2o policy.kv_ratio=0.01": "policy.kv_ratio",
    # each (layer, KV head) compresses on its own under after_prefill: no shared rotary positions
    f"{BM} policy.schedule=after_prefill policy.rerotate=true": "policy.rerotate",
    # a streaming head slides by whole blocks: the tiny model's random pattern keeps 2 + 10 pairs, under one block
    "mode=serve model=tiny-llama policy=duo_attention policy.schedule=prefill_and_decode": "serve.block_size",
}


@pytest.fixture
def no_model_loading(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(kvrun.models, "load_model", refuse)


@pytest.mark.parametrize("args", list(BAD), ids=list(BAD))
def test_bad_serve_value_is_one_line_exit_2(args, capsys, tmp_path, no_model_loading):
    assert_one_line_exit_2(cli.main, args.split() + [f"results_dir={tmp_path}"], capsys, BAD[args])
    assert not (tmp_path / "runs.jsonl").exists()


def test_serve_run_writes_one_record(tmp_path, monkeypatch):
    args = ["model=tiny-llama", "task.n_samples=5", "task.context_tokens=64", "gen.max_new_tokens=5",
            "mode=serve", "policy=window", "policy.kv_size=32", "policy.evict_every=8", "serve.block_size=8",
            "serve.num_blocks=12", "serve.rate=100", "serve.max_tokens_per_step=48", f"results_dir={tmp_path}"]
    monkeypatch.setattr(sys, "argv", ["kvbench"])
    cli.main(args)
    (rec,) = read_records(tmp_path)
    assert rec["status"] == "ok", rec.get("traceback")
    assert rec["mode"] == "serve" and rec["policy"] == "window"
    s = rec["serve"]
    assert s["completed"] == 5 and s["output_tokens"] == rec["generated_tokens"] > 0
    assert s["requests_per_s"] > 0 and s["output_tok_s"] == rec["throughput_tok_s"]
    assert s["ttft_s"]["p50"] <= s["ttft_s"]["p90"] <= s["ttft_s"]["p99"]
    assert 0 < s["pool_util_max"] <= 1 and s["evicted_blocks"] > 0
    assert len(s["timeline"]["t"]) == len(s["timeline"]["blocks_used"]) > 0
    assert any("serve_block_eviction" in e for e in rec["extensions"])
    rows = read_jsonl(rec["predictions_path"])
    assert len(rows) == 5 and all(r["ttft_s"] > 0 and len(r["token_ids"]) <= 5 for r in rows)
    assert rec["metrics"]["accuracy"] == sum(r["score"]["accuracy"] for r in rows) / 5
    assert (tmp_path / "serve_plots" / f"{rec['run_id']}.png").stat().st_size > 0


def test_arrivals_are_seeded_poisson():
    assert arrivals(3, None, 0) == [0.0, 0.0, 0.0]
    a, b = arrivals(2000, 4.0, 1), arrivals(2000, 4.0, 1)
    assert a == b and a[0] == 0.0 and all(x < y for x, y in zip(a, a[1:], strict=False))
    gaps = [y - x for x, y in zip(a, a[1:], strict=False)]
    assert abs(sum(gaps) / len(gaps) - 0.25) < 0.02  # mean gap 1 / rate
    assert arrivals(5, 4.0, 2) != arrivals(5, 4.0, 1)


def test_percentiles():
    p = percentiles([float(x) for x in range(1, 101)])
    assert p["p50"] == pytest.approx(50.5) and p["p90"] == pytest.approx(90.1) and p["p99"] == pytest.approx(99.01)
    assert percentiles([]) is None


def test_pool_sized_from_the_budget(tiny_llama):
    from omegaconf import OmegaConf

    from kvbench import memory
    from kvbench.policies import Full
    from kvbench.serve.pool import PagedPool
    from kvbench.serve.run import pool_blocks

    cfg = OmegaConf.create({"serve": {"num_blocks": None, "block_size": 16}})
    weights = sum(memory.ModelShape.of(tiny_llama.model).weights.values())
    per = PagedPool.block_bytes(num_layers=2, block_size=16, num_kv_heads=2, head_dim=16, dtype=tiny_llama.model.dtype,
                                track_attention=False)
    gb = (weights + 10.5 * per) / memory.GiB
    assert pool_blocks(cfg, tiny_llama, Full(), memory.MemoryLimit(gb)) == 10
    pool = PagedPool(num_layers=2, num_blocks=10, block_size=16, num_kv_heads=2, head_dim=16,
                     dtype=tiny_llama.model.dtype, device="cpu", track_attention=False)
    assert pool.nbytes() == 10 * per  # the sizing counts exactly what the pool allocates
    cfg.serve.num_blocks = 7
    assert pool_blocks(cfg, tiny_llama, Full(), None) == 7


def test_pool_leaves_room_for_the_policys_weights(tiny_llama):
    """KVzap's scorer (here the random one a nameless model gets, in the model's float64) is held beside the pool:
    the pool is what the limit leaves after the model's weights and the scorer's."""
    from omegaconf import OmegaConf

    from kvbench import memory
    from kvbench.artifacts.kvzap_scorer import tiny_scorer
    from kvbench.policies.kvzap import KVzap
    from kvbench.serve.pool import PagedPool
    from kvbench.serve.run import pool_blocks

    model = tiny_llama.model
    cfg = OmegaConf.create({"serve": {"num_blocks": None, "block_size": 16}})
    weights = sum(memory.ModelShape.of(model).weights.values())
    scorer = sum(p.numel() for p in tiny_scorer(model.config).parameters()) * model.dtype.itemsize
    per = PagedPool.block_bytes(num_layers=2, block_size=16, num_kv_heads=2, head_dim=16, dtype=model.dtype,
                                track_attention=False, own=1)  # its score, kept with each pair
    assert per // 4 < scorer < per // 4 * 3  # so a pool that forgot it would hold one block more
    gb = (weights + scorer + 10.75 * per) / memory.GiB
    assert pool_blocks(cfg, tiny_llama, KVzap(kv_size=32, evict_every=8), memory.MemoryLimit(gb)) == 10


def test_duo_attention_served_evicting_during_prefill_frees_pages(tmp_path, monkeypatch):
    """From the command line: DuoAttention served under prefill_and_decode (pages of 4 pairs, so a streaming
    head's 12-pair window is 3 pages) writes a true record whose KV is below the full cache's on the same prompts."""
    base = ["model=tiny-llama", "task.n_samples=3", "task.context_tokens=96", "gen.max_new_tokens=6", "mode=serve",
            "serve.block_size=4", "serve.max_tokens_per_step=32", f"results_dir={tmp_path}"]
    monkeypatch.setattr(sys, "argv", ["kvbench"])
    cli.main([*base, "policy=full"])
    cli.main([*base, "policy=duo_attention", "policy.schedule=prefill_and_decode"])
    full, duo = read_records(tmp_path)
    assert full["status"] == duo["status"] == "ok", duo.get("traceback")
    assert duo["schedule"] == "prefill_and_decode" and duo["policy"] == "duo_attention"
    assert duo["peak_kv_bytes"] < full["peak_kv_bytes"] and duo["decode_kv_bytes_peak"] < full["decode_kv_bytes_peak"]

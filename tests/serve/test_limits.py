"""OpenVINO's scheme in serve mode: its preset (serve.eviction=openvino), its two limit checks
(mode=serve_limits, on counts alone), goodput against TTFT/TPOT objectives, and serve.* refusals."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from kvbench import cli
from kvbench import run as kvrun
from kvbench.config import CONF_DIR
from kvbench.policies import H2O, BatchMax, Full
from kvbench.serve import metrics
from kvbench.serve.block_evict import BlockRule
from kvbench.serve.engine import ServeOutput
from kvbench.serve.limits import Pool, fewest_sequences_to_fill, longest_generation, replay
from kvbench.serve.request import Request
from tests.conftest import assert_one_line_exit_2

POOL = Pool(num_blocks=64, block_size=16, max_tokens_per_step=256)


@pytest.mark.parametrize("prompt", [100, 355, 1000])
def test_longest_generation_of_the_full_cache_is_the_pool_less_the_prompt(prompt):
    got = longest_generation(prompt, BlockRule.of(Full(), 16), POOL, cap=5000)
    # the KV of prompt + n output tokens holds prompt + n - 1 pairs (the last token is never cached)
    assert got["tokens"] == max(0, 64 * 16 - prompt + 1) and got["capped"] is False


@pytest.mark.parametrize("policy", [BatchMax(kv_size=64, evict_every=16), H2O(kv_size=64, evict_every=16)])
def test_eviction_makes_the_longest_generation_unbounded(policy):
    got = longest_generation(355, BlockRule.of(policy, 16), POOL, cap=3000)
    assert got["tokens"] == 3000 and got["capped"] is True
    # decode_only (H2O) holds its whole prompt first; prefill_and_decode never more than kv_size
    assert got["most_blocks"] == (23 if policy.schedule == "decode_only" else 4)


def test_fewest_sequences_that_fill_the_pool():
    full = fewest_sequences_to_fill([355, 200, 120], 8, BlockRule.of(Full(), 16), POOL)
    n = full["sequences"]
    lengths = [[355, 200, 120][i % 3] for i in range(n)]
    assert replay(lengths, 8, BlockRule.of(Full(), 16), POOL, True)[0].filled
    assert not replay(lengths[:-1], 8, BlockRule.of(Full(), 16), POOL, True)[0].filled
    # kv 32 under prefill_and_decode: 2 blocks per request at most, 64 blocks: about 32 requests
    bm = fewest_sequences_to_fill([355], 64, BlockRule.of(BatchMax(kv_size=32, evict_every=8), 16), POOL)
    assert 30 <= bm["sequences"] <= 33 and bm["sequences"] > 4 * n


def _cfg(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def test_serve_limits_mode_writes_a_record_without_a_model(tmp_path, monkeypatch):
    monkeypatch.setattr(kvrun.models, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    rec = kvrun.run(_cfg("model=tiny-llama", "mode=serve_limits", "policy=full", "serve.num_blocks=64",
                          "task.n_samples=2", "task.context_tokens=16", "gen.max_new_tokens=8", f"results_dir={tmp_path}"))
    assert rec["status"] == "ok" and rec["mode"] == "serve_limits" and rec["prompts"]["tokens_max"] == 355
    assert rec["serve_limits"]["longest_generation"]["tokens"] == 64 * 16 - 355 + 1
    assert rec["serve_limits"]["fewest_sequences_to_fill"]["sequences"] == 3


def test_openvino_preset_sets_its_areas_and_norm_sum(tmp_path):
    cfg = _cfg("model=tiny-llama", "mode=serve", "policy=h2o", "serve.eviction=openvino", "task.n_samples=1",
               "task.context_tokens=16", "gen.max_new_tokens=4", "serve.plot=false", f"results_dir={tmp_path}")
    rec = kvrun.run(cfg)
    assert rec["status"] == "ok" and rec["kv_size"] == 672
    p, s = rec["config"]["policy"], rec["config"]["serve"]
    assert (p["kv_size"], p["protect_first"], p["protect_recent"], p["schedule"], s["block_score"]) == (
        672, 32, 128, "decode_only", "norm_sum")
    assert any("block_score=norm_sum" in e for e in rec["extensions"])


@pytest.mark.parametrize("args,key", [
    ("mode=serve serve.eviction=openvino policy=batch_max", "serve.eviction"),
    ("mode=serve serve.eviction=openvino policy=h2o policy.protect_first=4", "policy.protect_first"),
    ("serve.eviction=openvino policy=h2o", "serve.eviction"),
    ("mode=serve serve.eviction=vllm", "serve.eviction"),
    ("mode=serve serve.slo_ttft_s=0", "serve.slo_ttft_s"),
    ("mode=serve serve.slo_tpot_s=-1", "serve.slo_tpot_s"),
    ("mode=serve_limits serve.num_blocks=null memory.limit_gb=4", "serve.num_blocks"),
    ("mode=serve serve.limit_cap=0", "serve.limit_cap"),
])
def test_bad_serve_values_stop_before_the_model(args, key, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(kvrun.models, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    assert_one_line_exit_2(cli.main, [*args.split(), "model=tiny-llama", f"results_dir={tmp_path}"], capsys, key)


def test_goodput_counts_requests_that_meet_both_objectives():
    def req(rid, ttft, tpot, n=5):
        r = Request(rid=rid, prompt=[0], max_new_tokens=n)
        r.output, r.first_token_at = [0] * n, ttft
        r.finished_at = ttft + tpot * (n - 1)
        return r

    reqs = [req(0, 0.5, 0.1), req(1, 3.0, 0.1), req(2, 0.5, 0.9), req(3, 0.2, 0.0, n=1)]
    out = ServeOutput(requests=reqs, wall_s=10.0, timeline=[(1.0, 4, 4, 0)])
    s = metrics.summarise(out, 8, 16, slo_ttft_s=1.0, slo_tpot_s=0.5)
    assert s["goodput_rps"] == pytest.approx(2 / 10.0) and s["slo_attained"] == 0.5  # requests 0 and 3
    assert s["slo"] == {"ttft_s": 1.0, "tpot_s": 0.5}

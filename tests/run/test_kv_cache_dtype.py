"""gen.kv_cache_dtype through the CLI: a quantized run's record, the refusals before load, the larger batch.

- `gen.kv_cache_dtype=int4 policy=batch_max` runs in mode=run to an ok record that says what was quantized (its
  extensions) and charges less KV than the same run in the model's dtype;
- mode=serve with a quantized cache serves Batch-Max over a quantized pool (its peak KV a fraction of the same run's
  in the model's dtype); without serve.max_running, or with a group other than serve.block_size, it is refused in
  one line before any model loads, as are serve_limits (it counts pages, never bytes), re-rotation, flash and a
  group that does not divide the head size;
- the max-batch search at one accounted memory limit finds a larger batch for int4 Batch-Max than for Batch-Max
  in the model's dtype (search.probe=account: the account alone decides, as on any CPU search), on a model of 32
  layers (with 2, the one layer read dequantized at a time outweighs what the cache saves).
"""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from kvbench import cli
from kvbench.config import CONF_DIR
from kvbench.run import run
from tests.conftest import assert_one_line_exit_2

TINY = ["model=tiny-llama", "task.n_samples=2", "task.context_tokens=200", "gen.max_new_tokens=4", "policy=batch_max",
        "policy.kv_size=64", "policy.evict_every=16"]
INT4 = ["gen.kv_cache_dtype=int4", "gen.kv_quant_group=16", "gen.kv_quant_residual=16"]  # the tiny head size: 16


def _run(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return run(compose("config", overrides=list(overrides)))


def test_int4_batch_max_runs_and_its_record_says_so(tmp_path):
    # 8 layers: the account's transient holds one layer read dequantized (tests/memory/test_account_quant.py), so
    # with the tiny model's 2 layers it outweighs the 2 layers' savings (552,280 accounted bytes against 547,160)
    plain = _run(*TINY, "model.layers=8", f"results_dir={tmp_path / 'a'}")
    int4 = _run(*TINY, *INT4, "model.layers=8", f"results_dir={tmp_path / 'b'}")
    assert plain["status"] == int4["status"] == "ok", int4["error"]
    assert any("4-bit codes" in e for e in int4["extensions"]) and not any("-bit codes" in e for e in plain["extensions"])
    # 64 pairs, 31 of them in the full-precision window: 0.61 here (tests/cache/test_qgroup.py: < 0.35 at 512)
    assert int4["peak_kv_bytes"] < 0.7 * plain["peak_kv_bytes"]
    assert int4["accounted_mem_bytes"] < plain["accounted_mem_bytes"]
    assert int4["config_hash"] != plain["config_hash"]


def test_int4_batch_max_serves_over_a_quantized_pool(tmp_path):
    serve = ["mode=serve", "batch_size=1", "serve.max_running=2", "serve.plot=false", "policy.kv_size=192"]
    plain = _run(*TINY, *serve, f"results_dir={tmp_path / 'a'}")
    int4 = _run(*TINY, *INT4, "gen.kv_quant_residual=0", *serve, f"results_dir={tmp_path / 'b'}")
    assert plain["status"] == int4["status"] == "ok", int4["error"]
    assert any(e.startswith("serve_quantized_pages") for e in int4["extensions"])
    assert any("4-bit codes" in e for e in int4["extensions"])
    assert int4["serve"]["evicted_blocks"] > 0
    assert int4["peak_kv_bytes"] < 0.35 * plain["peak_kv_bytes"]  # 0.33 measured: 12 pages a head, one of them also
    # in a full-precision window page (the codes and scales of a page: 0.25 of float32's at the tiny head of 16)
    assert int4["serve"]["pool_bytes"] < plain["serve"]["pool_bytes"]


@pytest.mark.parametrize(("extra", "key"), [
    (["mode=serve", "batch_size=1"], "serve.max_running"),  # the full-precision windows are sized by it
    (["mode=serve", "batch_size=1", "serve.max_running=2", "serve.block_size=32"], "gen.kv_quant_group"),
    (["mode=serve_limits", "batch_size=1"], "gen.kv_cache_dtype"),
    (["policy.rerotate=true"], "policy.rerotate"),
    (["gen.kv_quant_group=32"], "gen.kv_quant_group"),  # 32 does not divide the tiny models' head size (16)
    (["gen.kv_cache_dtype=int3"], "gen.kv_cache_dtype"),
])
def test_undefined_combinations_are_refused_in_one_line(extra, key, tmp_path, capsys):
    err = assert_one_line_exit_2(cli.main, [*TINY, *INT4, *extra, f"results_dir={tmp_path}"], capsys, key)
    assert not (tmp_path / "runs.jsonl").exists(), err


def _prepared(*overrides):
    from kvbench.config import prepare

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    prepare(cfg)
    return cfg


def test_the_groups_default_pairs_with_the_served_page(tmp_path):
    """`mode=serve gen.kv_cache_dtype=int4 serve.max_running=4`, every other key at its default, serves: the group
    left unset is the page (serve.block_size), a quantized pool's key group; elsewhere it is 32, as before the default
    was derived (records keep their identity); a group given explicitly must still equal the block size (issue 58)."""
    served = ["model=tiny-llama", "mode=serve", "gen.kv_cache_dtype=int4", "serve.max_running=4",
              f"results_dir={tmp_path}"]
    cli.preflight(served)
    assert _prepared(*served).gen.kv_quant_group == 16
    assert _prepared(*served, "serve.block_size=8").gen.kv_quant_group == 8
    assert _prepared("gen.kv_cache_dtype=int4").gen.kv_quant_group == 32  # mode=run: KIVI's 32
    assert _prepared(*served[:2]).gen.kv_quant_group == 32  # nothing quantized: the default the records hold
    from kvbench.config import config_hash

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        unset, given = (compose("config", overrides=[*served, *g]) for g in ([], ["gen.kv_quant_group=16"]))
    assert config_hash(unset) == config_hash(given)


@pytest.mark.parametrize("knob", ["gen.kv_quant_group=16", "gen.kv_quant_residual=0"])
def test_a_quantization_knob_without_a_quantized_cache(knob, tmp_path, capsys):
    """Set without a quantized cache it would be ignored, yet recorded (the report would split its run into a table
    of its own): a single run refuses it in one line, as a policy key its policy does not use; a sweep over the
    cache's dtype applies it where the cache is quantized and names it in the other jobs' ignored keys."""
    err = assert_one_line_exit_2(cli.main, ["model=tiny-llama", knob, f"results_dir={tmp_path}"], capsys,
                                 knob.split("=")[0])
    assert "gen.kv_cache_dtype" in err
    _, jobs = cli.compose_jobs(["-m", "model=tiny-llama", "gen.kv_cache_dtype=auto,int4", knob,
                                f"results_dir={tmp_path}"])
    key, value = knob.split("=")
    (_, auto, dropped), (_, int4, kept) = jobs
    assert dropped == [key] and kept == []
    assert auto.gen[key.split(".")[1]] in (None, 32) and int4.gen[key.split(".")[1]] == int(value)


def test_the_search_finds_a_larger_batch_for_int4(tmp_path):
    # 32 layers: a quantized cache reads one layer at a time in the model's dtype (a transient of about one layer's
    # pairs), so with the tiny model's 2 layers that transient outweighs what the cache saves; with 32 it does not
    common = [*TINY, "model.layers=32", "task.n_samples=32", "task.context_tokens=400", "policy.kv_size=256",
              "search.max_batch=true", "search.only=true", "search.probe=account",
              "search.candidates=[1,2,3,4,6,8,12,16,24,32]", "memory.limit_gb=0.02"]
    found = {name: _run(*common, *extra, f"results_dir={tmp_path / name}")["search"]
             for name, extra in (("auto", []), ("int4", INT4))}
    assert found["auto"]["first_oom_batch_size"] is not None  # the limit bites within the candidates
    assert found["int4"]["max_batch_size"] > found["auto"]["max_batch_size"] >= 1, found


def test_the_plan_shows_the_larger_batch_for_int4(tmp_path):
    """kvbench-plan (a meta model, no weights) charges the same quantized account: at one limit its Batch-Max row
    finds a larger batch with int4 than in the model's dtype, and its record names the cache's dtype."""
    from kvbench import capacity

    common = ["model=tiny-llama", "model.layers=32", "task.n_samples=32", "task.context_tokens=400",
              "gen.max_new_tokens=4", "policy=batch_max", "policy.kv_size=256", "policy.evict_every=16",
              "search.candidates=[1,2,3,4,6,8,12,16,24,32]", "device=cpu", "memory.limit_gb=0.02",
              "plan.backends=[sdpa]", "plan.kv_sizes=[256]", f"results_dir={tmp_path}"]
    best = {}
    for name, extra in (("auto", []), ("int4", INT4)):
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            rec = capacity.plan(compose("config", overrides=[*common, *extra]))
        assert rec["plan"]["kv_cache_dtype"] == name
        best[name] = next(r["max_batch_size"] for r in rec["plan"]["rows"] if r["policy"] == "batch_max")
    assert best["int4"] > best["auto"] >= 1, best

"""kvbench-plan: the paper's settings plan offline from the shipped configs, the meta model is placed
like a real load, and on the CPU the plan's largest batch and b0 are what the real search finds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from kvbench import capacity, memory
from kvbench import run as kvrun
from kvbench.config import CONF_DIR, build_policy, build_task
from kvbench.models import hub_spec
from kvbench.results import read_records

ROOT = Path(__file__).resolve().parents[2]
TINY = ["model=tiny-llama", "task.n_samples=8", "task.context_tokens=40", "gen.max_new_tokens=4",
        "policy=batch_max", "policy.kv_size=32", "policy.evict_every=8", "search.candidates=[1,2,3,4,6,8,12,16]",
        "device=cpu"]


def _compose(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides))


# ------------------------------------------------------------------------------------ shipped configs
@pytest.mark.parametrize("pretrained, published", [
    ("meta-llama/Llama-2-13b-chat-hf",
     dict(hidden_size=5120, num_hidden_layers=40, num_attention_heads=40, num_key_value_heads=40,
          intermediate_size=13824, vocab_size=32000, params=13.016e9)),
    ("microsoft/Phi-3.5-mini-instruct",
     dict(hidden_size=3072, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
          intermediate_size=8192, vocab_size=32064, params=3.821e9)),
])
def test_shipped_configs_are_the_published_ones(pretrained, published):
    spec = hub_spec("x", pretrained, dtype="float16", device="cuda")  # no Hub: HF_HUB_OFFLINE=1 in conftest
    params = published.pop("params")
    assert {k: getattr(spec.config, k) for k in published} == published
    model = spec.meta_model()
    n = sum(p.numel() for p in model.parameters())
    assert abs(n - params) / params < 1e-3  # 13.0B and 3.8B parameters, as published
    assert {p.device.type for p in model.parameters()} == {"meta"} and model.dtype.itemsize == 2


# ------------------------------------------------------------------------------------------ placement
def test_gpu_placement_follows_device_map_auto():
    cfg = _compose("experiment=paper_llama2_cnndm")
    node = capacity.node_of(cfg)
    assert node.max_memory == dict.fromkeys(range(4), 32510 * 2**20)
    spec = capacity.spec_of(cfg, node)
    model = spec.meta_model()
    shape = capacity.placed_shape(model, capacity.placement(model, spec, node))
    total = sum(p.numel() * p.element_size() for p in [*model.parameters(), *model.buffers()])
    assert sum(shape.weights.values()) == total
    assert sorted(shape.layers) == [f"cuda:{i}" for i in range(4)] and sum(shape.layers.values()) == 40
    # accelerate's balanced split: about a quarter of the weights each, the first GPU holding the embeddings
    assert all(abs(w - total / 4) < total / 10 for w in shape.weights.values())
    assert all(w <= node.max_memory[int(d[-1])] for d, w in shape.weights.items())


def test_unsplit_loader_shape_equals_the_loaded_models(tiny_llama):
    cfg = _compose(*TINY, "memory.limit_gb=1")
    spec = capacity.spec_of(cfg, capacity.node_of(cfg))
    model = spec.meta_model()
    shape = capacity.placed_shape(model, capacity.placement(model, spec, capacity.node_of(cfg)))
    real = memory.ModelShape.of(kvrun.models.load_model(cfg).model)
    assert shape == real


# ----------------------------------------------------------------------------- plan == search on CPU
def _budget_between(cfg, lo: int, hi: int) -> float:
    """A budget (GiB) between the accounted peaks of batch sizes lo and hi (probe batches, full cache)."""
    lm = kvrun.models.load_model(cfg)
    task = build_task(cfg)
    ids = [task.encode(lm.tokenizer, s.prompt) for s in task.samples(lm.tokenizer)]
    pol = build_policy(_compose(*TINY, "policy=full", "policy.kv_size=null"))
    from kvbench import search

    peak = {b: memory.account(lm.model, [len(x) for x in search.probe_prompts(ids, b)], pol,
                              max_new_tokens=cfg.gen.max_new_tokens).total for b in (lo, hi)}
    assert peak[lo] < peak[hi]
    return (peak[lo] + peak[hi]) / 2 / memory.GiB


def _real_peaks(cfg, policy_overrides: list[str], candidates: list[int]) -> dict[int, int]:
    """The accounted peak (bytes) of each candidate's worst-case batch, on the LOADED model with the prompts the
    runner tokenises: the oracle the plan is specified against, reached without the planner's meta model,
    placement, prompt lengths or search."""
    lm = kvrun.models.load_model(cfg)
    task = build_task(cfg)
    ids = sorted((len(task.encode(lm.tokenizer, s.prompt)) for s in task.samples(lm.tokenizer)), reverse=True)
    pol = build_policy(_compose(*TINY, *policy_overrides))
    return {b: memory.account(lm.model, [ids[i % len(ids)] for i in range(b)], pol,
                              max_new_tokens=cfg.gen.max_new_tokens).total for b in candidates}


@pytest.mark.parametrize("reserve", [0.0, 0.3])
def test_cpu_plan_finds_the_boundary_of_the_real_account(tmp_path, reserve):
    """The planner (meta model, no weights) gives, per policy, the largest candidate batch whose accounted peak
    on the real model fits the budget less the reserve, and the next candidate as b0 (the first OOM).

    The expected side is written here from the real model's account at each candidate (`_real_peaks`), not by
    running kvbench's search: an earlier version compared the plan with `search.probe=account`, the same
    account through the same search, so it could not disagree."""
    base = _compose(*TINY)
    budget = _budget_between(base, 4, 6)
    reserve_gb = reserve * budget
    common = [*TINY, f"memory.limit_gb={budget}", f"memory.reserve_gb={reserve_gb}", f"results_dir={tmp_path}"]
    rec = capacity.plan(_compose(*common, "plan.backends=[sdpa]", "plan.kv_sizes=[32]"))
    assert rec["mode"] == "plan" and read_records(tmp_path)[-1]["run_id"] == rec["run_id"]
    planned = {(r["policy"], r["kv_size"]): (r["max_batch_size"], r["first_oom_batch_size"]) for r in rec["plan"]["rows"]}
    candidates = [1, 2, 3, 4, 6, 8]  # search.candidates up to task.n_samples
    usable = (budget - reserve_gb) * memory.GiB
    policies = {("full", None): ["policy=full", "policy.kv_size=null"],
                ("extreme_decode", 2): ["policy=extreme_decode", "policy.kv_size=2", "policy.evict_every=null"],
                ("batch_max", 32): []}
    for key, overrides in policies.items():
        peaks = _real_peaks(base, overrides, candidates)
        fits = [b for b in candidates if peaks[b] <= usable]
        first_oom = next((b for b in candidates if peaks[b] > usable), None)
        assert planned[key] == (max(fits) if fits else None, first_oom), key
    if reserve == 0:  # the budget sits between the full cache's b=4 and b=6: the boundary is inside the candidates
        assert planned[("full", None)] == (4, 6)
    else:  # the reserve is taken off the budget: fewer fit
        assert planned[("full", None)][0] < 4


@pytest.mark.slow
def test_smollm2_plan_equals_the_search(tmp_path):
    """The mini CNN/DM setting (SmolLM2, real prompts, accounted 1.3 GiB): plan vs search.max_batch, eager and sdpa."""
    data = ROOT.parent / "shared" / "data"
    if not data.is_dir():
        pytest.skip("no dataset mirror beside the checkout")
    common = ["experiment=mini_cnndm", f"data.dir={data}", f"results_dir={tmp_path}"]
    rec = capacity.plan(_compose(*common, "plan.kv_sizes=[1024]"))
    planned = {(r["attention"], r["policy"]): r["max_batch_size"] for r in rec["plan"]["rows"]}
    for backend in rec["config"]["plan"]["backends"]:
        for pol in (["policy=extreme_decode", "policy.kv_size=2", "policy.evict_every=null"], []):
            run = kvrun.run(_compose(*common, *pol, f"gen.attention={backend}", "search.max_batch=true",
                                      "search.only=true"))
            assert run["status"] == "ok", run["error"]
            assert planned[(backend, run["policy"])] == run["search"]["max_batch_size"]


# ------------------------------------------------------------------------------ the paper's settings
@pytest.mark.parametrize("experiment", ["paper_llama2_cnndm", "paper_phi35_gsm8k"])
def test_paper_settings_plan_offline(tmp_path, experiment):
    rec = capacity.plan(_compose(f"experiment={experiment}", f"results_dir={tmp_path}"))  # its time: scripts/, not here
    rows = rec["plan"]["rows"]
    assert {(r["attention"], r["method"]) for r in rows} >= {(a, m) for a in ("eager", "sdpa") for m in ("ED", "FKV", "BM")}
    by = {(r["attention"], r["method"], r["kv_size"]): r for r in rows}
    for a in ("eager", "sdpa"):  # the paper's ordering of capacities holds under either backend
        ed, fkv = by[(a, "ED", 2)], by[(a, "FKV", None)]
        assert fkv["max_batch_size"] <= ed["max_batch_size"] < ed["first_oom_batch_size"]
        assert all(r["max_batch_size"] > ed["max_batch_size"] for k, r in by.items() if k[0] == a and k[1] == "BM")
    assert rec["plan"]["model"]["layers"] and len(rec["plan"]["model"]["layers"]) == len(rec["plan"]["node"]["budget_bytes"])
    text = capacity.table(rec)
    assert "eager" in text and "sdpa" in text and "BM" in text


def test_a_budget_above_the_sequence_plans_no_smaller_batch_than_the_full_cache(tmp_path):
    """Batch-Max at kv_size 8192 on prompts of 1000 tokens + 256 new never evicts: its cache holds each sequence
    whole, as the full cache does, so its largest batch is no smaller (the meta model of the shipped
    Llama 3.1 8B config, one 40 GiB GPU; preallocating 8192 slots planned 24 against the full cache's 80)."""
    rec = capacity.plan(_compose("model=llama31-8b", "plan.gpus=1", "plan.gpu_mem_mib=40960", "plan.prompt_tokens=1000",
                                 "gen.max_new_tokens=256", "policy=batch_max", "policy.kv_size=8192",
                                 "plan.backends=[sdpa]", "task.n_samples=128",
                                 "search.candidates=[8,16,24,32,48,64,80,96,128]", f"results_dir={tmp_path}"))
    best = {r["method"]: r["max_batch_size"] for r in rec["plan"]["rows"]}
    assert best["FKV"] >= 64 and best["BM"] >= best["FKV"], best


def test_command_prints_the_table_and_rejects_bad_input(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "kvbench.capacity"]
    out = subprocess.run([*cmd, "experiment=paper_phi35_cnndm", "plan.backends=[sdpa]", f"results_dir={tmp_path}"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.rsplit("kvbench-plan: ", 1)[1])
    assert [r["method"] for r in summary["rows"]] == ["ED", "FKV", "BM"]
    out = subprocess.run([*cmd, "experiment=paper_phi35_cnndm", "plan.backends=[fast]", f"results_dir={tmp_path}"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "plan.backends" in out.stderr, out.stderr


def test_gemma4_s_quantization_group_is_checked_against_both_head_sizes(tmp_path):
    """Gemma 4 31B's sliding layers have head_dim 256, its global ones 512: a group of 512 divides the global layers'
    only and is refused in one line naming gen.kv_quant_group (kvbench-plan prints it, exit code 2) before anything is
    planned (issue 58: a traceback from the store); 256 plans."""
    from kvbench.errors import ConfigError

    plan = ["model=gemma4-31b", "plan.gpus=1", "plan.gpu_mem_mib=81920", "plan.prompt_tokens=3584",
            "plan.backends=[sdpa]", "gen.kv_cache_dtype=int8", "search.candidates=[1,2,4]", f"results_dir={tmp_path}"]
    line = r"gen\.kv_quant_group=512: values are grouped .* head_dims 256 and 512 \(its layers differ\)$"
    with pytest.raises(ConfigError, match=line):
        capacity.plan(_compose(*plan, "gen.kv_quant_group=512"))
    assert not read_records(tmp_path)
    assert capacity.plan(_compose(*plan, "gen.kv_quant_group=256"))["plan"]["rows"]


def test_the_old_memory_key_is_refused_naming_the_new_one():
    from kvbench.capacity.plan_cli import preflight
    from kvbench.errors import ConfigError

    with pytest.raises(ConfigError, match=r"memory\.budget_gb: was renamed memory\.limit_gb"):
        preflight(["experiment=paper_phi35_cnndm", "memory.budget_gb=2"])


@pytest.mark.parametrize("overrides, key", [
    (["model=tiny-llama", "device=cpu"], "memory.limit_gb"),  # a CPU plan needs a budget
    (["experiment=paper_phi35_cnndm", "plan.kv_sizes=[64]"], "plan.kv_sizes"),  # not above evict_every
    (["experiment=paper_phi35_cnndm", "plan.gpus=8", "model.max_memory=null", "memory.limit_gb=null"],
     "plan.gpu_mem_mib"),
    (["experiment=paper_llama2_cnndm", "plan.gpu_mem_mib=4000"], "plan.gpu_mem_mib"),  # 13B fp16 on 4 x 4 GB
    (["experiment=paper_phi35_cnndm", "plan.prompt_tokens=null"], "plan.prompt_tokens"),  # no tokenizer offline
])
def test_bad_plans_name_the_key(tmp_path, overrides, key):
    from kvbench.errors import ConfigError

    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        capacity.plan(_compose(*overrides, f"results_dir={tmp_path}"))
    assert not read_records(tmp_path)


@pytest.mark.parametrize("experiment", ["paper_llama2_cnndm", "paper_phi35_narrativeqa"])
def test_paper_experiments_run_the_papers_conditions(experiment):
    """eager attention and Algorithm 1's whole first block by default; SDPA one override away."""
    cfg = _compose(f"experiment={experiment}")
    assert (cfg.gen.attention, cfg.gen.prefill_chunk) == ("eager", 4096)
    assert cfg.gen.prefill_chunk >= cfg.task.max_input_tokens  # the first block (and ED's prompt) in one forward
    assert _compose(f"experiment={experiment}", "gen.attention=sdpa").gen.attention == "sdpa"

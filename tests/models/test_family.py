"""The family matrix: every decoder family kvbench accepts runs exactly, or is refused before it loads.

Tiny random models of each family (kvbench.models.tiny.FAMILY_ARCHS: windows of 16-24 tokens), a batch
of 2 prompts of 70 and 57 tokens (left padding, longer than every window): kvbench's full cache gives
transformers' `generate` tokens, one for one, in float32 (every backend, whole-prompt and chunked prefill)
and in bfloat16 (with the attention transformers itself runs: SDPA, or eager for Gemma 2 and gpt-oss).
Families kvbench does not run exactly are refused with one line naming the family (exit code 2), by the
CLI's preflight, the loader and `kvbench.generate`, before any weight is built.

Policies on windowed models (a sampled cover of policies x schedules; KVBENCH_FAMILIES=full: all) run,
compress the full-attention layers only, and windowed layers keep their window.
"""

from __future__ import annotations

import dataclasses
import itertools
import os

import pytest
import torch

from kvbench import engine
from kvbench.errors import ConfigError
from kvbench.models import build_tiny, family
from kvbench.models.tiny import FAMILY_ARCHS, tiny_config
from kvbench.policies import H2O, TOVA, BatchMax, Full, PyramidKV, SnapKV, StreamingLLM, Window

REFUSED_ARCHS = ("gemma3-bidirectional",)  # tiny models of what kvbench refuses
ARCHS = ["llama", "phi3", *[a for a in FAMILY_ARCHS if a not in REFUSED_ARCHS]]
HF_EAGER = ("gemma2", "gpt-oss")  # transformers runs these eagerly (no SDPA for soft-capping / sinks)
BACKENDS = ("sdpa", "eager", "fused")
NEW = 10
_models: dict = {}


def model(arch: str, dtype: str = "float32"):
    if (arch, dtype) not in _models:
        _models[arch, dtype] = build_tiny(f"tiny-{arch}", arch=arch, dtype=dtype, device="cpu")
    return _models[arch, dtype]


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in (70, 57)]


def hf_generate(m, prompts, n=NEW, pad=258):
    """transformers' own greedy generation of a left-padded batch."""
    B, s = len(prompts), max(map(len, prompts))
    ids, am = torch.full((B, s), pad), torch.zeros(B, s, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, s - len(p):], am[b, s - len(p):] = torch.tensor(p), 1
    out = m.generate(ids, attention_mask=am, max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=pad)
    return out[:, s:].tolist()


def run(lm, prompts, policy=None, **kw):
    return engine.generate(lm.model, lm.tokenizer, prompts, policy or Full(), batch_size=len(prompts),
                           max_new_tokens=kw.pop("max_new_tokens", NEW), eos_token_ids=[], **kw)


def test_every_family_is_accepted_or_refused():
    """Every tiny arch is of a family the adapter accepts; the refused ones say why in one line."""
    for arch in ARCHS:
        assert family.refusal(tiny_config(arch)) is None, arch
    for arch in REFUSED_ARCHS:
        why = family.refusal(tiny_config(arch))
        assert why and "\n" not in why and family.family_of(tiny_config(arch)) in why


def test_known_families_kvbench_cannot_run_say_why_in_one_line():
    """Hybrid linear-attention, latent-attention, KV-sharing and chunked families: one line naming the family and
    what its cache holds that kvbench's does not; their multimodal wrappers refuse through their text config."""
    from transformers import AutoConfig

    for model_type, reason in family.REFUSED.items():
        why = family.refusal(AutoConfig.for_model(model_type))
        assert why and "\n" not in why and model_type in why and reason in why, model_type
    shared = family.refusal(AutoConfig.for_model("gemma4_text", num_kv_shared_layers=2))  # Gemma 4 E2B / E4B
    assert shared.startswith("model family 'gemma4_text' with num_kv_shared_layers=2") and "\n" not in shared
    assert family.refusal(AutoConfig.for_model("gemma4")) is None  # Gemma 4 31B's shape, through its text config
    for wrapper in ("qwen3_5", "qwen3_5_moe"):  # hybrids kvbench runs: through their text config
        assert family.refusal(AutoConfig.for_model(wrapper)) is None, wrapper


def test_smollm3_sliding_layers_need_use_sliding_window():
    """SmolLM3 windows a sliding_attention layer only with use_sliding_window (its attention gets no window
    otherwise, while transformers' mask still has one): refused then, read as windowed when set."""
    cfg = tiny_config("smollm3")
    cfg.layer_types, cfg.sliding_window = ["sliding_attention", "full_attention"], 16
    assert "use_sliding_window=false" in family.refusal(cfg)
    cfg.use_sliding_window = True
    assert family.refusal(cfg) is None and family.kinds(cfg).windows == (16, None)


@pytest.mark.parametrize("arch", ARCHS)
def test_full_cache_equals_hf_generate_float32(arch, prompts):
    """SDPA on the whole prompt, then eager or fused (alternating over the families; both for windowed or sink
    models) on chunks of 16 or 23 (windows of 16-24 are crossed mid-chunk, and the window groups are trimmed)."""
    lm = model(arch)
    ref = hf_generate(lm.model, prompts)
    k = family.kinds(lm.model.config)
    runs = [("sdpa", None)] + ([("eager", 16), ("fused", 23)] if k.windowed or k.sinks else
                               [(("eager", 16), ("fused", 23))[ARCHS.index(arch) % 2]])
    for backend, chunk in runs:
        out = run(lm, prompts, attention=backend, prefill_chunk=chunk)
        assert out.token_ids == ref, (arch, backend, chunk)


@pytest.mark.parametrize("arch", ["llama", "mistral-window", "qwen2-window", "phi3-window", "gemma2", "gemma3",
                                  "starcoder2", "gpt-oss", "mixtral", "qwen3-moe", "glm4", "glm4-moe", "ministral",
                                  "ministral3", "olmo3", "smollm3", "exaone4", "gemma4", "qwen3.5", "qwen3.5-moe",
                                  "qwen3-next"])
def test_full_cache_equals_hf_generate_bfloat16(arch, prompts):
    """In bfloat16 with the attention transformers runs (tokens depend on the kernel's rounding)."""
    lm = model(arch, "bfloat16")
    ref = hf_generate(lm.model, prompts)
    out = run(lm, prompts, attention="eager" if arch in HF_EAGER else "sdpa")  # the whole prompt, as transformers
    assert out.token_ids == ref, arch


def test_windowed_layers_hold_only_their_window(prompts):
    """Gemma 3's local layer holds W - 1 + the widest forward; its global layer the whole sequence."""
    lm = model("gemma3")
    held = []
    out = run(lm, prompts, prefill_chunk=16,
              observer=lambda ev, c: held.append([(g.sliding, g.capacity, int(g.n.max())) for g in c.groups]))
    assert out.token_ids == hf_generate(lm.model, prompts)
    local = [h for step in held for h in step if h[0] is not None]
    full = [h for step in held for h in step if h[0] is None]
    assert local and max(n for _, _, n in local) <= 16 - 1 + 16 and {c for _, c, _ in local} == {16 - 1 + 16}
    assert max(n for _, _, n in full) == 70 + NEW - 1


def _no_windows(arch):
    cfg = tiny_config(arch)
    cfg.layer_types = ["full_attention"] * cfg.num_hidden_layers
    return cfg


def test_windowed_model_peak_kv_below_the_same_model_without_windows(prompts):
    """Measured from the cache's real tensors (not the account), then the account agrees with it."""
    from transformers import AutoModelForCausalLM

    lm = model("gemma3")
    allocated = []

    def watch(ev, c):
        allocated.append(c.allocated_bytes())

    windowed = run(lm, prompts, prefill_chunk=16, observer=watch, max_new_tokens=30)
    peak_windowed = max(allocated)
    allocated.clear()
    plain = AutoModelForCausalLM.from_config(_no_windows("gemma3"))
    plain.load_state_dict(lm.model.state_dict())
    plain.eval()
    out = engine.generate(plain, lm.tokenizer, prompts, Full(), batch_size=2, max_new_tokens=30, eos_token_ids=[],
                          prefill_chunk=16, observer=watch)
    peak_plain = max(allocated)
    assert peak_windowed < 0.8 * peak_plain, (peak_windowed, peak_plain)
    assert windowed.peak_kv_bytes < out.peak_kv_bytes
    assert windowed.accounted.devices["cpu"].kv_cache == windowed.kv_allocated_bytes == peak_windowed
    assert out.accounted.devices["cpu"].kv_cache == peak_plain


POLICIES = {
    "h2o": lambda: H2O(kv_size=24, evict_every=1),
    "tova": lambda: TOVA(kv_size=24, evict_every=1),
    "snapkv": lambda: SnapKV(kv_size=24, window=8, evict_every=8),
    "pyramidkv": lambda: PyramidKV(kv_size=24, window=8, evict_every=8),
    "window": lambda: Window(kv_size=24, evict_every=4),
    "streaming_llm": lambda: StreamingLLM(kv_size=24, evict_every=4),
}
SCHEDULES = ("prefill_and_decode", "decode_only", "after_prefill")
MIXED = ("gemma3", "gpt-oss", "qwen2-window", "gemma2")


def _cover():
    product = list(itertools.product(MIXED, POLICIES, SCHEDULES))
    if os.environ.get("KVBENCH_FAMILIES") == "full":
        return product
    # every family, policy and schedule at least once; each family with two policies
    return [(a, p, s) for i, (a, p, s) in enumerate(product) if i % 5 == 0]


@pytest.mark.parametrize("arch,name,schedule", _cover())
def test_policies_compress_full_layers_only(arch, name, schedule, prompts):
    lm = model(arch)
    kinds = family.kinds(lm.model.config)
    try:
        policy = dataclasses.replace(POLICIES[name](), schedule=schedule)
    except ConfigError as e:  # a policy that refuses this schedule says so
        pytest.skip(f"{name} refuses {schedule}: {e}")
    seen = []
    out = run(lm, prompts, policy, prefill_chunk=8, attention="auto",
              observer=lambda ev, c: seen.append([(g.sliding, g.layers, int(g.n.max()), g.budget) for g in c.groups]))
    assert len(out.token_ids) == 2 and all(len(t) == NEW for t in out.token_ids)
    for sliding, layers, n, budget in (g for step in seen for g in step):
        if sliding is not None:  # a windowed layer keeps its window (+ the forward's chunk), whatever the policy
            assert all(kinds.windows[i] == sliding for i in layers) and n <= sliding - 1 + 8
        else:  # the full-attention layers are the policy's
            assert all(kinds.windows[i] is None for i in layers)
            if schedule == "prefill_and_decode":
                assert n <= int(budget.max())
    last = {sliding: n for sliding, _, n, _ in seen[-1]}
    assert last[None] < 70 + NEW - 1  # compressed (the full cache would hold the whole sequence)


def test_a_layer_whose_window_the_adapter_missed_raises(prompts, monkeypatch):
    """The guard behind the adapter: were a family's windows misread, the attention raises, never runs silently."""
    lm = model("mistral-window")
    monkeypatch.setitem(family.FAMILIES, "mistral", family.NONE)  # the defect: Mistral read as full attention
    with pytest.raises(RuntimeError, match="sliding_window=16"):
        run(lm, prompts)


def h2o_record(arch: str, tmp_path) -> dict:
    """The record of a small H2O run (kv_size 24, 2 samples of 60 tokens) on the tiny model of `arch`."""
    from hydra import compose, initialize_config_dir

    from kvbench import run as kvrun
    from kvbench.config import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["model=tiny-llama", f"model.arch={arch}", "task.n_samples=2",
                                           "task.context_tokens=60", "gen.max_new_tokens=4", "batch_size=2",
                                           "policy=h2o", "policy.kv_size=24", f"results_dir={tmp_path}"])
    rec = kvrun.run(cfg)
    assert rec["status"] == "ok", rec["error"]
    return rec


def test_record_names_the_layers_a_policy_compressed(tmp_path):
    rec = h2o_record("gemma3", tmp_path)
    assert rec["compressed_layers"] == [1] and rec["model_family"].startswith("gemma3_text: 1 of 2 layers windowed")
    assert any("windowed layers [0] keep their sliding window" in e for e in rec["extensions"])


def test_pyramid_spans_the_compressed_layers_only(prompts, tmp_path):
    """PyramidKV on tiny Gemma 3 (layer 0 windowed, layer 1 full): its pyramid spans the one layer it compresses,
    so that layer holds the nominal budget, kv_ratio x the prompt (a pyramid over both layers gave it the bottom
    of the pyramid: 8 of a nominal 35), and the record's kv_budget is what that layer held."""
    seen = []
    policy = PyramidKV(kv_ratio=0.5, window=8, schedule="after_prefill")
    run(model("gemma3"), prompts, policy, observer=lambda ev, c: seen.append(
        [(g.budget.tolist(), g.n.tolist()) for g in c.groups if g.sliding is None]))
    nominal = [-(-len(p) // 2) for p in prompts]  # ceil(0.5 x 70), ceil(0.5 x 57)
    (budget, held), = seen[-1]  # the full-attention layer, after the compression and the new tokens
    assert budget == nominal and held == [k + NEW - 1 for k in nominal], (budget, held)
    from hydra import compose, initialize_config_dir

    from kvbench import run as kvrun
    from kvbench.config import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["model=tiny-llama", "model.arch=gemma3", "task.n_samples=2",
                                           "task.context_tokens=60", "gen.max_new_tokens=4", "batch_size=2",
                                           "policy=pyramidkv", "policy.kv_ratio=0.5", "policy.window=8",
                                           "policy.schedule=after_prefill", f"results_dir={tmp_path}"])
    rec = kvrun.run(cfg)
    assert rec["status"] == "ok", rec["error"]
    lo, hi = rec["prompts"]["tokens_min"], rec["prompts"]["tokens_max"]
    assert rec["kv_budget"] == {"by": "kv_ratio", "min": -(-lo // 2), "max": -(-hi // 2), "per_layer": False}
    assert any("compresses the 1 full-attention layers only (per-layer budgets" in e and ": over these 1 layers" in e
               for e in rec["extensions"]), rec["extensions"]


def test_policy_on_a_model_without_full_layers_is_refused(prompts):
    lm = model("mistral-window")
    with pytest.raises(ConfigError, match="no full-attention layer"):
        run(lm, prompts, H2O(kv_size=24))


def test_generate_refuses_a_family_it_cannot_run(prompts):
    """`kvbench.generate` on a model of a refused family: ConfigError (one line), nothing generated."""
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_config(tiny_config("gemma3-bidirectional")).eval()
    with pytest.raises(ConfigError, match="gemma3_text.*bidirectional"):
        engine.generate(m, model("llama").tokenizer, prompts, Full(), max_new_tokens=2)


def test_loader_refuses_before_building_weights(monkeypatch):
    import transformers

    def boom(*a, **k):
        raise AssertionError("weights were built")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", boom)
    with pytest.raises(ConfigError, match="gemma3_text.*bidirectional"):
        build_tiny("t", arch="gemma3-bidirectional", device="cpu")


@pytest.mark.parametrize("arch,fragment", [("gemma3-bidirectional", "bidirectional")])
def test_cli_refuses_a_family_before_loading(arch, fragment, capsys, tmp_path, monkeypatch):
    import transformers

    from kvbench.cli import main
    from tests.conftest import assert_one_line_exit_2

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("weights were built")))
    assert_one_line_exit_2(main, ["model=tiny-llama", f"model.arch={arch}", "task=passkey", "task.n_samples=1",
                                  f"results_dir={tmp_path}"], capsys, fragment)


def test_serve_refuses_a_windowed_model(capsys, tmp_path):
    from kvbench.cli import main
    from tests.conftest import assert_one_line_exit_2

    assert_one_line_exit_2(main, ["model=tiny-llama", "model.arch=gemma3", "mode=serve", "task=passkey",
                                  "task.n_samples=1", f"results_dir={tmp_path}"], capsys, "serve")


# ------------------------------------------------------------------------- the model= choices, planned offline
NEW_MODELS = {  # model= choice -> (parameters as published, in billions; windowed layers)
    "llama31-8b": (8.03, 0), "qwen3-8b": (8.19, 0), "mistral-7b-v03": (7.25, 0), "phi3-mini-4k": (3.82, 32),
    "phi4-mini": (3.84, 0), "gemma3-4b": (3.88, 29), "gpt-oss-20b": (20.9, 12), "qwen3-30b-a3b": (30.5, 0),
}


def _plan(*overrides):
    from hydra import compose, initialize_config_dir

    from kvbench import capacity
    from kvbench.config import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return capacity.plan(compose("config", overrides=list(overrides)))


@pytest.mark.parametrize("name", NEW_MODELS)
def test_new_model_choices_plan_offline(name, tmp_path):
    """Each shipped config plans without the Hub (HF_HUB_OFFLINE=1): one 80 GiB GPU, 4,000-token prompts."""
    from kvbench.capacity import table

    prompt = 1500 if name == "phi3-mini-4k" else 4000  # a 4k model (its window of 2047 must not cut: see below)
    rec = _plan(f"model={name}", "plan.gpus=1", "plan.gpu_mem_mib=81920", f"plan.prompt_tokens={prompt}",
                "plan.backends=[sdpa]", "policy=batch_max", "policy.kv_size=512", "gen.max_new_tokens=256",
                "search.candidates=[1,2,4,8,16,32,64,128,256]", f"results_dir={tmp_path}")
    params, windowed = NEW_MODELS[name]
    m = rec["plan"]["model"]
    assert abs(m["parameters"] / 1e9 - params) / params < 0.01
    assert (f"{windowed} of" in m["attention_kinds"]) if windowed else m["attention_kinds"] == "full attention in every layer"
    rows = {r["method"]: r for r in rec["plan"]["rows"]}
    assert rows["FKV"]["max_batch_size"] <= rows["BM"]["max_batch_size"]
    assert "full KV cache of one longest sample" in table(rec)


@pytest.mark.parametrize("name", ["ministral3-8b", "glm4-9b"])
def test_shipped_choices_of_the_new_families_plan_offline(name, tmp_path):
    """Text-decoder configs whose published parameter count kvbench could not check offline: they plan, as the
    family kvbench runs them (full attention in every layer)."""
    rec = _plan(f"model={name}", "plan.gpus=1", "plan.gpu_mem_mib=81920", "plan.prompt_tokens=4000",
                "plan.backends=[sdpa]", "policy=h2o", "policy.kv_size=512", "gen.max_new_tokens=256",
                "search.candidates=[1,2,4,8,16,32,64]", f"results_dir={tmp_path}")
    assert rec["plan"]["model"]["attention_kinds"] == "full attention in every layer"
    assert rec["model"] == name
    rows = {r["method"]: r for r in rec["plan"]["rows"]}
    assert rows["FKV"]["max_batch_size"] <= rows["H2O"]["max_batch_size"]


def test_gemma4_plans_offline_with_its_kv_per_token_per_layer_kind(tmp_path):
    """Gemma 4 31B: 50 sliding layers of 16 KV heads x 256, 10 global layers of 4 x 512 (K = V)."""
    from kvbench.capacity import table

    rec = _plan("model=gemma4-31b", "plan.gpus=1", "plan.gpu_mem_mib=81920", "plan.prompt_tokens=4000",
                "plan.backends=[sdpa]", "policy=h2o", "policy.kv_size=512", "gen.max_new_tokens=256",
                "search.candidates=[1,2,4,8]", f"results_dir={tmp_path}")
    kinds = {(k["window"], k["kv_heads"], k["head_dim"]): (k["layers"], k["bytes"]) for k in rec["plan"]["model"]["kv_per_token"]}
    assert kinds == {(1024, 16, 256): (50, 16384), (None, 4, 512): (10, 8192)}
    assert "50 windowed layers 16 x 256: 16,384 B, 10 full layers 4 x 512: 8,192 B" in table(rec)
    rows = {r["method"]: r for r in rec["plan"]["rows"]}
    assert rows["FKV"]["max_batch_size"] <= rows["H2O"]["max_batch_size"]


@pytest.mark.parametrize("policy", [H2O(kv_size=24, evict_every=1), BatchMax(kv_size=24, evict_every=4)],
                         ids=lambda p: p.name)
def test_gemma4_evicts_its_global_layer_under_prefill_and_decode(policy, prompts):
    """H2O and Batch-Max on tiny Gemma 4: the global layer (1 KV head x 32) is compressed to the budget, the
    sliding one (2 x 16) keeps its window; the account's cache equals the cache's allocation (per-group shapes)."""
    lm = model("gemma4")
    policy = dataclasses.replace(policy, schedule="prefill_and_decode")
    seen, allocated = [], []

    def watch(ev, c):
        allocated.append(c.allocated_bytes())
        seen.append([(g.sliding, tuple(g.layers), (g.k.shape[2], g.k.shape[4]), int(g.n.max()), g.budget)
                     for g in c.groups])

    out = run(lm, prompts, policy, prefill_chunk=8, observer=watch)
    assert all(len(t) == NEW for t in out.token_ids)
    for sliding, layers, hd, n, budget in (g for step in seen for g in step):
        assert hd == ((2, 16) if layers == (0,) else (1, 32))
        assert (n <= 16 - 1 + 8) if sliding is not None else n <= int(budget.max())
    assert max(n for sliding, _, _, n, _ in seen[-1] if sliding is None) <= 24  # compressed (full: 70 + NEW - 1)
    assert out.accounted.devices["cpu"].kv_cache == out.kv_allocated_bytes == max(allocated)


def test_plan_compresses_windowed_layers_below_their_window_and_refuses_a_budget_at_it(tmp_path):
    """Phi-3-mini-4k's every layer has a window of 2047, shorter than 3000-token prompts: a budget of 2047 or more
    leaves the policy no layer to compress (refused); a budget below it compresses every layer, so H2O at 1024
    plans a batch holding less KV than the full cache's."""
    common = ("model=phi3-mini-4k", "plan.gpus=1", "plan.gpu_mem_mib=81920", "plan.prompt_tokens=3000",
              "plan.backends=[sdpa]", f"results_dir={tmp_path}", "policy=h2o")
    with pytest.raises(ConfigError, match="no full-attention layer .* not below any window"):
        _plan(*common, "policy.kv_size=2047")
    rows = {r["policy"]: r for r in _plan(*common, "policy.kv_size=1024")["plan"]["rows"]}
    assert rows["h2o"]["kv_size"] == 1024 and rows["h2o"]["max_batch_size"] == 8


def test_gemma3_plan_credits_its_windows(tmp_path):
    """Gemma 3 with the prompt in chunks of its window: 29 of 34 layers hold 1,023 + 1,024 pairs at most, so a
    4,256-token sample's full cache is 0.56 of the same model's without windows (whole-prompt prefill: the
    windowed layers hold the prompt during its forward, as transformers' sliding cache does: no credit)."""
    args = ["model=gemma3-4b", "plan.gpus=1", "plan.gpu_mem_mib=24576", "plan.prompt_tokens=4000", "plan.backends=[sdpa]",
            "gen.max_new_tokens=256", "search.candidates=[1,2,4,8]", f"results_dir={tmp_path}"]
    chunked = _plan(*args, "gen.prefill_chunk=1024")
    m = chunked["plan"]["model"]
    expected = (5 * 4257 + 29 * (1023 + 1024 + 1)) / (34 * 4257)  # slots, the scratch slot included
    assert m["kv_bytes_one_sample"] / m["kv_bytes_one_sample_without_windows"] == pytest.approx(expected, rel=1e-6)
    whole = _plan(*args)["plan"]["model"]
    assert whole["kv_bytes_one_sample"] == whole["kv_bytes_one_sample_without_windows"] == m["kv_bytes_one_sample_without_windows"]
    assert "0 of" not in m["attention_kinds"] and "29 of 34 layers windowed (W=[1024])" == m["attention_kinds"]


@pytest.mark.parametrize("arch", ["llama3", "qwen3", "olmo2", "granite", "cohere", "mistral", "mixtral", "qwen3-moe",
                                  "glm4", "glm4-moe", "ministral3", "smollm3"])
def test_serve_equals_the_static_engine_on_full_attention_families(arch, prompts):
    """Serve mode (paged pool, continuous batching) gives the static engine's tokens on every family without
    windows, sinks or soft-capping; on the others it is refused (below, and in the preflight above)."""
    from kvbench.serve.engine import serve
    from kvbench.serve.request import Request

    lm = model(arch)
    want = run(lm, prompts).token_ids
    reqs = [Request(rid=i, prompt=list(p), max_new_tokens=NEW, arrival=0.0) for i, p in enumerate(prompts)]
    serve(lm.model, reqs, Full(), num_blocks=64, block_size=4, max_tokens_per_step=32)
    assert [r.output for r in reqs] == want


@pytest.mark.parametrize("arch", ["gemma3", "gpt-oss", "gemma2"])
def test_serve_refuses_windows_sinks_and_softcapping(arch):
    from kvbench.serve.engine import serve
    from kvbench.serve.request import Request

    with pytest.raises(ConfigError, match="serve mode runs full attention only"):
        serve(model(arch).model, [Request(rid=0, prompt=[1, 2, 3], max_new_tokens=2)], Full(), num_blocks=8,
              block_size=4, max_tokens_per_step=8)


def _phi3_longrope(limit: int = 32):
    """Tiny Phi-3 with longrope whose short/long switch sits at `limit` positions (no window)."""
    from transformers import AutoModelForCausalLM

    from kvbench.models.loaded import finish
    from kvbench.models.tiny import byte_tokenizer

    cfg = tiny_config("phi3-window")
    cfg.sliding_window = None
    cfg.rope_parameters = {**cfg.rope_parameters, "original_max_position_embeddings": limit}
    cfg.original_max_position_embeddings = limit
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    m.generation_config.eos_token_id, m.generation_config.pad_token_id = cfg.eos_token_id, cfg.pad_token_id
    return finish(m, byte_tokenizer(), "tiny-phi3-longrope")


def test_length_dependent_rope_is_one_forward_or_refused(prompts, monkeypatch):
    """longrope picks short or long factors from the largest position of each forward (switch at 32 here).
    A 70-token prompt equals transformers in one forward; prefilled in chunks it would not (checked with the check
    switched off), so kvbench refuses it. A sequence that crosses the switch while decoding is refused too:
    transformers' Phi-3 drops its cache and recomputes everything with the long factors there. Sequences below
    the switch equal transformers in chunks."""
    lm = _phi3_longrope()
    assert family.rope_length_limit(lm.model.config) == 32
    ref = hf_generate(lm.model, prompts)
    assert run(lm, prompts).token_ids == ref  # the whole prompt in one forward, as transformers
    with pytest.raises(ConfigError, match="in chunks"):
        run(lm, prompts, prefill_chunk=16)
    crossing = [p[:30] for p in prompts]  # 30 + 10 new tokens: crosses 32 while decoding
    with pytest.raises(ConfigError, match="recomputes"):
        run(lm, crossing)
    monkeypatch.setattr(family, "check_length_rope", lambda *a: None)
    assert run(lm, prompts, prefill_chunk=16).token_ids != ref  # the defects the refusals prevent
    assert run(lm, crossing).token_ids != hf_generate(lm.model, crossing)
    monkeypatch.undo()
    below = [p[:20] for p in prompts]  # 20 + 10 new: never past the switch
    assert run(lm, below, prefill_chunk=8).token_ids == hf_generate(lm.model, below)


@pytest.mark.parametrize("extra,fragment", [
    (["policy=batch_max", "policy.kv_size=64", "policy.evict_every=16"], "in chunks"),  # prompts past the switch
    (["mode=serve", "policy=full"], "serve mode mixes requests"),
])
def test_cli_refuses_a_length_dependent_rope_before_loading(extra, fragment, capsys, tmp_path, monkeypatch):
    import transformers

    from kvbench.cli import main
    from kvbench.config import preflight
    from tests.conftest import assert_one_line_exit_2

    cfg = _phi3_longrope().model.config
    monkeypatch.setattr(preflight, "model_config", lambda _cfg: cfg)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("weights were built")))
    assert_one_line_exit_2(main, ["model=tiny-phi3", "task=passkey", "task.n_samples=1", *extra,
                                  f"results_dir={tmp_path}"], capsys, fragment)


@pytest.mark.parametrize("policy,fragment", [
    ("expected_attention", "expected_attention with head_budget=uniform reads one (KV heads, head size)"),
    ("kvzap", "kvzap with head_budget=uniform reads one (KV heads, head size)")])
def test_gemma4_refuses_policies_that_read_one_head_shape(policy, fragment):
    from kvbench.policies import registry

    with pytest.raises(ConfigError) as e:
        family.check_policy(model("gemma4").model.config, registry()[policy](kv_size=24))
    assert "\n" not in str(e.value) and fragment in str(e.value) and "1 x 32, 2 x 16" in str(e.value)

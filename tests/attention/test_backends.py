"""The attention backends (kvbench.attention): `eager` is transformers' eager path on kvbench's cache and
takes its statistics from the same probabilities; `fused` computes output and statistics from one set of
probabilities per query chunk. Both must generate what the SDPA path (+ the separate statistics pass,
`attention_stats`) generates, keep the same pairs, and be what the record says was used.
"""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import eager_attention_forward

from kvbench import attention as A
from kvbench.attention.eager import eager_attention
from kvbench.attention.fused import fused_attention
from kvbench.attention.masks import keep_mask
from kvbench.cache import KVCache
from kvbench.engine import generate
from kvbench.policies import H2O, TOVA, BatchMax, ExtremeDecode, Full, Window
from tests.conftest import SMOLLM2_TEXTS, load_smollm2, random_prompts
from tests.policies.test_scored import PROMPTS, PerSample, pid

NEW = 24


def run(lm, policy, attention: str, batch_size: int = 4, **kw):
    """Tokens and, per sample, the kept positions after each of its evictions and at the end."""
    obs = PerSample(len(PROMPTS))
    out = generate(lm.model, lm.tokenizer, PROMPTS, policy, batch_size, max_new_tokens=NEW, eos_token_ids=[],
                   observer=obs, attention=attention, **kw)
    return out, obs


# ------------------------------------------------------------------------- one attention call, in isolation
def _step(B: int, T: int, N: int, r: list[int], H: int, D: int, dtype):
    """A cache holding N - max(r) pairs per sample, then a forward of T queries, sample b bringing r[b] real ones."""
    cache = KVCache(batch_size=B, num_kv_heads=H, head_dim=D, capacity=N, dtype=dtype, layer_devices=["cpu"],
                    track_attention=True)
    old = N - max(r)
    if old:
        cache.begin_forward(torch.full((B,), old), old)
    cache.begin_forward(torch.tensor(r), T)
    return cache.step_for(0)


@pytest.mark.parametrize("r", [[8, 8, 8], [8, 3, 5], [1, 1, 1]], ids=["all-real", "left-padded", "decode"])
@pytest.mark.parametrize("heads", [(4, 2), (4, 4)], ids=["gqa", "mha"])
def test_eager_and_fused_equal_transformers_eager_and_the_stats_pass(r, heads):
    """Eager's output is transformers' `eager_attention_forward` with the additive mask (bit for bit);
    both backends' statistics equal `attention_stats` (the SDPA path's separate pass), pad queries
    excluded; fused's output equals eager's."""
    Hq, H = heads
    B, T, N, D = len(r), max(r), 20, 8
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, Hq, T, D, generator=g, dtype=torch.float64)  # (B, Hq, T, D)
    k = torch.randn(B, H, N, D, generator=g, dtype=torch.float64)  # (B, H_kv, N, D)
    v = torch.randn(B, H, N, D, generator=g, dtype=torch.float64)
    step = _step(B, T, N, r, H, D, torch.float64)
    keep = keep_mask(step, T, N, "cpu")
    mask = None if keep is None else torch.zeros(keep.shape, dtype=q.dtype).masked_fill(~keep, torch.finfo(q.dtype).min)
    module = torch.nn.Module()
    module.num_key_value_groups, module.training = Hq // H, False
    want, _ = eager_attention_forward(module, q, k, v, mask, scaling=0.3)  # (B, T, Hq, D)
    got, stats = eager_attention(q, k, v, step, 0.3, track=True)
    real = step.real[:, :, None, None]
    assert torch.equal(got * real, want * real)
    fused, fstats = fused_attention(q, k, v, step, 0.3, chunk=3)
    torch.testing.assert_close(fused * real, want * real)
    ref = A.attention_stats(q, k, step, 0.3, chunk=64)
    for s in (stats, fstats):
        for a, b in zip(s, ref, strict=True):
            assert a.shape == (B, H, N) and a.dtype == torch.float32
            torch.testing.assert_close(a, b)
    assert not torch.equal(stats[0], stats[1]) or T == 1  # w_sum and w_last differ with several queries


# ------------------------------------------------------------------------- whole generations
@pytest.mark.parametrize(
    "policy",
    [Full(), Window(kv_size=32, evict_every=8), ExtremeDecode(kv_size=2), BatchMax(kv_size=32, evict_every=8),
     BatchMax(kv_size=32, evict_every=8, schedule="decode_only"), H2O(kv_size=32),
     TOVA(kv_size=24, evict_every=3, schedule="prefill_and_decode")],
    ids=lambda p: f"{p.name}-{p.schedule}",
)
@pytest.mark.parametrize("arch", ["llama", "phi3"])
def test_eager_generates_the_sdpa_tokens(arch, policy, request):
    """gen.attention=eager: the same greedy tokens and kept pairs as SDPA (+ the statistics pass), batch 4
    left-padded, float64 tiny models."""
    lm = request.getfixturevalue(f"tiny_{arch}")
    sdpa, obs_sdpa = run(lm, policy, "sdpa")
    eager, obs_eager = run(lm, policy, "eager")
    assert (sdpa.attention, eager.attention) == ("sdpa", "eager")
    assert eager.token_ids == sdpa.token_ids
    assert obs_eager.evictions == obs_sdpa.evictions and obs_eager.final == obs_sdpa.final


FUSED_POLICIES = [
    BatchMax(kv_size=32, evict_every=8),
    BatchMax(kv_size=32, evict_every=8, schedule="decode_only"),
    H2O(kv_size=32),
    H2O(kv_size=32, evict_every=4, schedule="prefill_and_decode"),
    TOVA(kv_size=32),
    TOVA(kv_size=24, evict_every=3, schedule="prefill_and_decode"),
]


@pytest.mark.parametrize("policy", FUSED_POLICIES, ids=pid)
@pytest.mark.parametrize("arch", ["llama", "phi3"])
def test_fused_keeps_what_the_separate_statistics_pass_keeps(arch, policy, request):
    """gen.attention=fused: tokens and every eviction's kept pairs unchanged against the previous path
    (SDPA + attention_stats), batch 4 left-padded, both schedules; with query chunks smaller than a block."""
    lm = request.getfixturevalue(f"tiny_{arch}")
    sdpa, obs_sdpa = run(lm, policy, "sdpa")
    assert any(obs_sdpa.evictions)
    for score_chunk in (64, 5):
        fused, obs_fused = run(lm, policy, "fused", score_chunk=score_chunk)
        assert fused.attention == "fused"
        assert fused.token_ids == sdpa.token_ids
        assert obs_fused.evictions == obs_sdpa.evictions and obs_fused.final == obs_sdpa.final


def test_fused_without_statistics_is_sdpa(tiny_llama):
    out = generate(tiny_llama.model, tiny_llama.tokenizer, random_prompts((20, 12)), Window(kv_size=16, evict_every=4),
                   2, max_new_tokens=3, eos_token_ids=[], attention="fused")
    assert out.attention == "sdpa"


# ------------------------------------------------------------------------- the record
@pytest.mark.parametrize("attention,policy,want", [("eager", "window", "eager"), ("fused", "batch_max", "fused"),
                                                   ("fused", "full", "sdpa"), ("sdpa", "h2o", "sdpa"),
                                                   ("auto", "h2o", "fused"), ("auto", "window", "sdpa")])
def test_record_names_the_backend_used(tmp_path, attention, policy, want):
    from hydra import compose, initialize_config_dir

    from kvbench import run as kvrun
    from kvbench.config import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["model=tiny-llama", "task.n_samples=2", "task.context_tokens=32",
                                           "gen.max_new_tokens=2", f"policy={policy}",
                                           f"gen.attention={attention}", f"results_dir={tmp_path}"])
    record = kvrun.run(cfg)
    assert record["status"] == "ok" and record["attention"] == want


@pytest.mark.slow
def test_smollm2_eager_generates_the_sdpa_tokens():
    """SmolLM2-135M in float32, short runs: eager (materialised float32 probabilities) and SDPA agree."""
    lm = load_smollm2()
    prompts = [lm.tokenizer(t)["input_ids"] for t in SMOLLM2_TEXTS]
    for policy in (Full(), BatchMax(kv_size=48, evict_every=16)):
        kw = dict(max_new_tokens=12, eos_token_ids=[])
        sdpa = generate(lm.model, lm.tokenizer, prompts, policy, 4, attention="sdpa", **kw)
        eager = generate(lm.model, lm.tokenizer, prompts, policy, 4, attention="eager", **kw)
        assert eager.token_ids == sdpa.token_ids, policy.name

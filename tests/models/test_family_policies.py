"""H2O and Batch-Max under `prefill_and_decode` on every family of the family matrix (tests/models/test_family.py's
tiny models, the same padded batch of a 70- and a 57-token prompt, prefilled in chunks of 8).

Each policy holds every full-attention layer within its budget at every forward (Algorithm 1 evicts before the
cache would overflow), windowed layers keep their window (+ the forward's chunk), the cache ends compressed, and
the batch's padded sample gets the tokens it gets alone: neither the padding nor the other sample reaches its
scores, whatever the family's attention (q/k norms, partial or interleaved RoPE, NoPE layers, a position-scaled
query, MoE MLPs). A model whose every layer is windowed for these sequences is refused instead (nothing to
compress).
"""

from __future__ import annotations

import pytest
import torch

from kvbench.errors import ConfigError
from kvbench.models import family
from kvbench.policies import H2O, BatchMax
from tests.models.test_family import ARCHS, NEW, model, run

POLICIES = {
    "h2o": lambda: H2O(kv_size=24, evict_every=1, schedule="prefill_and_decode"),
    "batch_max": lambda: BatchMax(kv_size=24, evict_every=8),  # prefill_and_decode, its published schedule
}
CHUNK = 8


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in (70, 57)]


@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("arch", ARCHS)
def test_h2o_and_batch_max_compress_every_family(arch, name, prompts):
    lm, policy = model(arch), POLICIES[name]()
    assert policy.schedule == "prefill_and_decode"
    kinds = family.kinds(lm.model.config)
    if all(w is not None for w in kinds.windows_for(70 + NEW)):
        with pytest.raises(ConfigError, match="no full-attention layer"):
            run(lm, prompts, policy, prefill_chunk=CHUNK)
        return
    seen = []
    out = run(lm, prompts, policy, prefill_chunk=CHUNK,
              observer=lambda ev, c: seen.append([(g.sliding, g.layers, int(g.n.max()), g.budget) for g in c.groups]))
    assert [len(t) for t in out.token_ids] == [NEW, NEW]
    for sliding, layers, n, budget in (g for step in seen for g in step):
        if sliding is None:  # the policy's layers: within the budget at every forward
            assert all(kinds.windows[i] is None for i in layers) and n <= int(budget.max()), (arch, layers, n)
        else:  # a windowed layer keeps its window, whatever the policy
            assert all(kinds.windows[i] == sliding for i in layers) and n <= sliding - 1 + CHUNK
    assert max(n for sliding, _, n, _ in seen[-1] if sliding is None) < 70 + NEW - 1  # compressed
    alone = run(lm, [prompts[1]], policy, prefill_chunk=CHUNK)
    assert out.token_ids[1] == alone.token_ids[0], arch


def policy_record(arch: str, policy: str, tmp_path, *overrides: str) -> dict:
    """The record of a small run of `policy` (2 passkey samples of 60 context tokens, batch 2, 4 new tokens, half of
    each prompt kept) on the tiny model of `arch`."""
    from hydra import compose, initialize_config_dir

    from kvbench import run as kvrun
    from kvbench.config import CONF_DIR

    budget = [] if policy == "duo_attention" else ["policy.kv_ratio=0.5"]  # DuoAttention: its head pattern
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["model=tiny-llama", f"model.arch={arch}", "task.n_samples=2",
                                           "task.context_tokens=60", "gen.max_new_tokens=4", "batch_size=2",
                                           f"policy={policy}", *budget, f"results_dir={tmp_path}", *overrides])
    return kvrun.run(cfg)


HYBRID_POLICIES = ("expected_attention", "kvzip", "kvzip_plus", "kvgrad", "kvzap", "compactor", "critical",
                   "duo_attention")


@pytest.mark.parametrize("policy", HYBRID_POLICIES)
@pytest.mark.parametrize("arch", ["qwen3.5", "qwen3-next"])
def test_policies_reading_the_attention_modules_run_on_a_hybrid(arch, policy, tmp_path):
    """The policies that read each layer's attention module (its projections, its input hidden states, scoring passes)
    compress a hybrid's attention layers; its linear-attention layers have no K/V to score (issue 58: they crashed
    after the model loaded, reading `self_attn` of every layer)."""
    rec = policy_record(arch, policy, tmp_path)
    assert rec["status"] == "ok", rec["error"]
    k = family.kinds(model(arch).model.config)
    assert rec["compressed_layers"] == k.full_layers and k.linear and rec["kv_kept_share"] < 1


def test_compactor_runs_on_gemma4_s_two_layer_shapes(tmp_path):
    """Compactor reads each layer's own K/V heads and head size (Gemma 4's global layer: 1 x 32, its sliding one
    2 x 16), not the config's (transformers refuses `num_key_value_heads` there: issue 58)."""
    rec = policy_record("gemma4", "compactor", tmp_path, "task.context_tokens=80")
    assert rec["status"] == "ok", rec["error"]
    assert rec["compressed_layers"] == [1] and rec["kv_kept_share"] < 1


@pytest.mark.parametrize("arch", ["glm4", "glm4-moe", "qwen3.5"])
def test_expected_attention_runs_and_serves_with_partial_rope(arch, tmp_path, prompts):
    """ExpectedAttention on partial RoPE (GLM-4: half the dims, interleaved; Qwen3.5: a quarter) runs to a true record,
    and serve mode (where it serves the family) gives the static engine's tokens (issue 58: its D x D rotation was
    built from the rotary dims only)."""
    from kvbench import engine
    from kvbench.policies import ExpectedAttention
    from kvbench.serve.engine import serve
    from tests.serve.test_engine import requests

    rec = policy_record(arch, "expected_attention", tmp_path)
    assert rec["status"] == "ok", rec["error"]
    assert rec["kv_kept_share"] < 1
    lm = model(arch)
    if family.kinds(lm.model.config).plain:  # serve mode runs full-attention models only (Qwen3.5: refused)
        policy = ExpectedAttention(kv_size=16, n_future_positions=64)
        want = engine.generate(lm.model, lm.tokenizer, prompts[:2], policy, batch_size=1, max_new_tokens=6,
                               eos_token_ids=[]).token_ids
        reqs = requests(prompts[:2], 6)
        out = serve(lm.model, reqs, policy, num_blocks=400, block_size=1, max_tokens_per_step=64)
        assert out.evicted_blocks > 0 and [r.output for r in reqs] == want

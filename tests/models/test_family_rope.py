"""Re-rotation (`policy.rerotate=true`) on the families whose RoPE is one rotate-half rotation of every layer's keys,
and its refusal, before anything runs, on those whose RoPE is not (kvbench.models.family.rope_problem).

Checked like tests/cache/test_rotate.py on layer 0, whose keys depend only on the token and the position: after
every eviction each kept key equals the key transformers itself computes for that token at the key's slot (a
forward of the model over the kept tokens at positions 0..n-1, its own cache's layer-0 keys). GLM-4-MoE rotates a
partial rotary half with q/k norms, Qwen3-MoE normalises q and k. GLM-4 and Cohere rotate interleaved pairs and a
NoPE layer no pair at all: with their refusal switched off, the same comparison fails, which is why they are refused.
"""

from __future__ import annotations

import pytest
import torch

from kvbench.engine import generate
from kvbench.errors import ConfigError
from kvbench.models import build_tiny, family, geometry
from kvbench.models.family import adapter
from kvbench.policies import StreamingLLM
from tests.conftest import random_prompts

PROMPTS = random_prompts((70, 45), seed=7)
NEW = 12


def policy():
    return StreamingLLM(kv_size=24, evict_every=4, rerotate=True)


def snapshots(lm):
    """(kept layer-0 keys (B, H, cap, D), their source positions (B, H, cap), counts (B,)) after each eviction, and
    each sample's whole sequence."""
    snaps = []

    def watch(event, cache):
        if event == "evict":
            g, i = cache._where[0]
            snaps.append((g.k[i].clone(), g.pos[i].clone(), cache.n.clone()))

    out = generate(lm.model, lm.tokenizer, PROMPTS, policy(), len(PROMPTS), max_new_tokens=NEW, eos_token_ids=[],
                   observer=watch)
    return snaps, [torch.tensor(p + t) for p, t in zip(PROMPTS, out.token_ids, strict=True)]


def layer0_keys(model, tokens: torch.Tensor) -> torch.Tensor:
    """Layer 0's keys (H_kv, n, D) of `tokens` (n,) at positions 0..n-1, from transformers' own forward and cache."""
    with torch.inference_mode():
        out = model(input_ids=tokens[None], position_ids=torch.arange(len(tokens))[None], use_cache=True)
    return out.cache.layers[0].keys[0]


def rerotation_error(lm) -> float:
    snaps, seqs = snapshots(lm)
    assert snaps, "nothing was evicted"
    err = 0.0
    for K, pos, n in snaps:
        for b, seq in enumerate(seqs):
            nb = int(n[b])
            if nb == 0:  # this sample has not started yet (right-aligned prefill)
                continue
            for h in range(K.shape[1]):
                want = layer0_keys(lm.model, seq[pos[b, h, :nb].long()])[h]  # (n_b, D) at slots 0..n_b-1
                err = max(err, float((K[b, h, :nb] - want).abs().max()))
    return err


@pytest.mark.parametrize("arch", ["glm4-moe", "qwen3-moe"])
def test_rerotated_keys_are_transformers_keys_at_their_slots(arch):
    lm = build_tiny(f"tiny-{arch}", arch=arch, device="cpu")
    assert family.rope_problem(lm.model.config) is None
    assert rerotation_error(lm) < 1e-4


def _nope_smollm3():
    """SmolLM3 whose layer 0 applies no RoPE (its keys do not depend on the position at all)."""
    lm = build_tiny("tiny-smollm3", arch="smollm3", device="cpu")
    lm.model.config.no_rope_layers = [0, 0]
    for layer in lm.model.model.layers:
        layer.self_attn.use_rope = False
    return lm


@pytest.mark.parametrize("build,fragment", [
    (lambda: build_tiny("tiny-glm4", arch="glm4", device="cpu"), "interleaved pairs"),
    (lambda: build_tiny("tiny-cohere", arch="cohere", device="cpu"), "interleaved pairs"),
    (_nope_smollm3, "NoPE"),
])
def test_rerotation_is_refused_where_it_would_be_wrong(build, fragment, monkeypatch):
    lm = build()
    with pytest.raises(ConfigError, match=f"policy.rerotate.*{fragment}"):
        generate(lm.model, lm.tokenizer, PROMPTS, policy(), len(PROMPTS), max_new_tokens=NEW, eos_token_ids=[])
    for where in (adapter, geometry):  # the defect the refusal prevents: re-rotating anyway
        monkeypatch.setattr(where, "rope_problem", lambda config: None)
    assert rerotation_error(lm) > 1e-2


def test_interleaved_rope_lists_every_family_whose_rotation_pairs_neighbours():
    """INTERLEAVED_ROPE is the families whose transformers `rotate_half` pairs (x0, x1), (x2, x3)... (read from its
    source, so a family added with GPT-J-style RoPE and not listed fails here)."""
    import importlib
    import inspect

    from kvbench.models.family.table import FAMILIES, INTERLEAVED_ROPE

    found = set()
    for model_type in FAMILIES:
        try:
            module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
        except ModuleNotFoundError:  # a text config of a multimodal family (gemma3_text): its parent's module
            continue
        rotate_half = getattr(module, "rotate_half", None)
        if rotate_half is not None and "::2]" in inspect.getsource(rotate_half):
            found.add(model_type)
    assert found == set(INTERLEAVED_ROPE)


def test_refusals_of_rerotation_name_the_reason():
    from kvbench.models.tiny import tiny_config

    assert "llama_4_scaling_beta" in (family.rope_problem(_without_yarn(tiny_config("ministral3"))) or "")
    assert "yarn" in family.rope_problem(tiny_config("ministral3"))
    assert "[1]" in family.rope_problem(tiny_config("exaone4")) and "[1]" in family.rope_problem(tiny_config("smollm3"))


def _without_yarn(cfg):
    cfg.rope_parameters = {"rope_type": "default", "rope_theta": 1e6, "llama_4_scaling_beta": 0.1,
                           "original_max_position_embeddings": 32}
    return cfg

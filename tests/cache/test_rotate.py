"""RoPE re-rotation (`policy.rerotate=true`): after every eviction the kept keys are exactly the keys
computed afresh at contiguous positions 0..n-1 (their slots), and new tokens continue from the kept
count. Checked on layer 0, whose keys depend only on the token and the position, against
transformers' own rotary embedding (tiny Llama with GQA, float64), at batch 4 with left padding."""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from kvbench.engine import generate
from kvbench.policies import BatchMax, SnapKV, StreamingLLM, Window
from tests.conftest import random_prompts

PROMPTS = random_prompts((70, 24, 45, 13), seed=7)
NEW = 20


class Layer0Keys:
    """Observer: layer 0's keys, source positions and counts after every forward and eviction."""

    def __init__(self):
        self.snaps = []

    def __call__(self, event, cache):
        g, i = cache._where[0]
        self.snaps.append((event, g.k[i].clone(), g.pos[i].clone(), cache.n.clone()))


def fresh_keys(model, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Layer 0's keys (H_kv, n, D) of `tokens` (n,) rotated at `positions` (n,), by transformers."""
    m = model.model
    attn = m.layers[0].self_attn
    h = m.layers[0].input_layernorm(m.embed_tokens(tokens[None]))  # (1, n, hidden)
    k = attn.k_proj(h).view(1, len(tokens), -1, attn.head_dim).transpose(1, 2)  # (1, H_kv, n, D)
    cos, sin = m.rotary_emb(k, positions[None])
    _, k = apply_rotary_pos_emb(k, k, cos, sin)
    return k[0]


def run(lm, policy):
    obs = Layer0Keys()
    out = generate(lm.model, lm.tokenizer, PROMPTS, policy, 4, max_new_tokens=NEW, eos_token_ids=[], observer=obs)
    seqs = [torch.tensor(p + t) for p, t in zip(PROMPTS, out.token_ids, strict=True)]
    return obs.snaps, seqs, out.token_ids


def max_error(lm, snaps, seqs, rotary) -> tuple[float, int]:
    """Largest |cached - fresh| over every kept layer-0 key of every snapshot, and the evictions seen.

    rotary(slot, source position) -> the position the fresh key is rotated at."""
    err, evictions = 0.0, 0
    with torch.inference_mode():
        for event, K, pos, n in snaps:
            evictions += event == "evict"
            for b, seq in enumerate(seqs):
                nb = int(n[b])
                if nb == 0:  # this sample has not started yet (right-aligned prefill)
                    continue
                for h in range(K.shape[1]):
                    src = pos[b, h, :nb].long()  # (n_b,) source positions, in slot order
                    slots = torch.arange(nb)
                    want = fresh_keys(lm.model, seq[src], rotary(slots, src))[h]  # (n_b, D)
                    err = max(err, float((K[b, h, :nb] - want).abs().max()))
    return err, evictions


@pytest.mark.parametrize(
    "policy",
    [BatchMax(kv_size=32, evict_every=8, rerotate=True),
     BatchMax(kv_size=32, evict_every=8, schedule="decode_only", rerotate=True),
     StreamingLLM(kv_size=24, evict_every=4, rerotate=True),
     SnapKV(kv_size=32, evict_every=8, window=8, rerotate=True)],
    ids=lambda p: f"{p.name}-{p.schedule}",
)
def test_rerotated_keys_equal_keys_computed_at_the_new_positions(tiny_llama, policy):
    snaps, seqs, _ = run(tiny_llama, policy)
    err, evictions = max_error(tiny_llama, snaps, seqs, lambda slots, src: slots)
    assert evictions > 0
    assert err < 1e-5, err  # float32 RoPE tables, composed once per eviction
    # the comparison can fail: the same keys are far from keys rotated at their source positions
    wrong, _ = max_error(tiny_llama, snaps, seqs, lambda slots, src: src)
    assert wrong > 1e-2, wrong


def test_without_rerotation_keys_stay_at_their_source_positions(tiny_llama):
    snaps, seqs, plain = run(tiny_llama, BatchMax(kv_size=32, evict_every=8))
    err, evictions = max_error(tiny_llama, snaps, seqs, lambda slots, src: src)
    assert evictions > 0 and err < 1e-9, err
    _, _, rotated = run(tiny_llama, BatchMax(kv_size=32, evict_every=8, rerotate=True))
    assert rotated != plain  # positions matter: re-rotation changes what is generated


def test_rerotate_is_recorded_and_validated():
    assert any("rerotate" in e for e in Window(rerotate=True).describe()["extensions"])
    assert not any("rerotate" in e for e in Window().describe()["extensions"])
    # StreamingLLM publishes re-indexed positions: a departure only without it
    assert any("source positions" in e for e in StreamingLLM().describe()["extensions"])
    assert not any("position" in e or "rerotate" in e for e in StreamingLLM(rerotate=True).describe()["extensions"])
    from kvbench.errors import ConfigError

    with pytest.raises(ConfigError, match="policy.rerotate"):
        Window(rerotate="yes")

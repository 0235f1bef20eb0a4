"""DuoAttention head scores computed on the fly (kvpress 0.5.5 `duo_attention_on_the_fly`), on any local text.

kvpress calibrates on 50 BookSum chapters; here the caller gives the token-id sequences (whole texts, tokenized
with special tokens as kvpress's `tokenizer(text)` does). Per text and layer: the hidden states entering
attention (`input_layernorm` of the layer's input); the mean over the text's positions of the pre-RoPE query
(Hq, D) and key (H_kv, D) (q_norm / k_norm applied where the attention module has per-head norms, as kvpress
does for Qwen3); the mean query placed at position q_len-1 and the mean key at 0..q_len-1 with the model's
rotary embedding; weights = float32 softmax(q k^T / sqrt(D)); a query head's score is the mean over t of the
cumulative sum of its weights (mass on early positions: high = retrieval); mean over the group, then over texts.
Departures (kvpress covers Llama/Mistral/Qwen3 only): OLMo2's whole-projection q/k norms are applied and its
un-normalised layer input used (it normalises after attention); the pre-RoPE queries and keys and the RoPE are the
layer's own (kvbench.models.prerope: Qwen3.5's gated query projection, partial RoPE's pass-through dims, NoPE
layers); a hybrid's linear-attention layers have no heads to score; fused-projection (Phi-3) and interleaved-RoPE
(GLM-4) models are refused. The logits are not scaled by a family's own attention scale (Gemma's
query_pre_attn_scalar, Granite's multiplier): kvpress's 1/sqrt(D), as it does.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from kvbench.artifacts.duo_patterns import ON_THE_FLY_WINDOWS, HeadPattern
from kvbench.attention.interface import attention_modules
from kvbench.errors import ConfigError
from kvbench.models import prerope
from kvbench.models.family.table import INTERLEAVED_ROPE


def _check(model) -> None:
    """Models this rule cannot read the same way: fused q/k/v projections, interleaved (GPT-J) RoPE."""
    attn = next(m for m in attention_modules(model) if m is not None)
    if not (hasattr(attn, "q_proj") and hasattr(attn, "k_proj")):
        raise ConfigError("policy.calibration", "on-the-fly DuoAttention needs separate q_proj and k_proj "
                          "(this model fuses them)", model.config.model_type)
    if model.config.model_type in INTERLEAVED_ROPE:
        raise ConfigError("policy.calibration", "on-the-fly DuoAttention uses rotate-half RoPE; this model "
                          "rotates interleaved pairs", model.config.model_type)


@torch.no_grad()
def head_scores(model, sequences: list[list[int]], q_len: int = 500) -> np.ndarray:
    """(L, H_kv) float32 scores averaged over `sequences` (each one text's ids, forwarded whole, batch 1); a hybrid's
    linear-attention layers (no KV heads) score 0 (DuoAttention ranks the attention layers' heads only)."""
    if not sequences or any(len(s) == 0 for s in sequences):
        raise ConfigError("policy.calibration", "needs at least one non-empty token sequence")
    _check(model)
    cfg = model.config
    hq, hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    group = hq // hkv
    scores = torch.zeros(cfg.num_hidden_layers, hkv)  # (L, H_kv)
    dev = next(model.parameters()).device
    positions = torch.arange(q_len, device=dev).unsqueeze(0)  # (1, q_len)
    modules = attention_modules(model)
    for ids in sequences:
        hidden = model(input_ids=torch.tensor([ids], device=dev), output_hidden_states=True).hidden_states[:-1]
        for li, h in enumerate(hidden):  # h: (1, T, hidden), the layer's input
            attn = modules[li]
            if attn is None:
                continue
            d = attn.head_dim
            pre = getattr(model.model.layers[li], "input_layernorm", None)  # OLMo2 normalises after attention
            h = pre(h) if pre is not None else h
            q = prerope.queries(attn, h).mean(2, keepdim=True).expand(-1, -1, q_len, -1)  # (1, Hq, q_len, D)
            k = prerope.keys(attn, h).mean(2, keepdim=True).expand(-1, -1, q_len, -1)  # (1, H_kv, q_len, D)
            cos, sin = prerope.cos_sin(model.model.rotary_emb, positions, h, attn)
            q, k = prerope.apply(attn, q, cos, sin), prerope.apply(attn, k, cos, sin)
            k = k.repeat_interleave(group, dim=1)  # (1, Hq, q_len, D)
            w = (q[:, :, -1:, :] @ k.transpose(2, 3) / d**0.5).softmax(dim=-1, dtype=torch.float32).squeeze()
            s = torch.cumsum(w, dim=1).mean(1)  # (Hq,)
            scores[li] += s.view(-1, group).mean(1).cpu() / len(sequences)
    return scores.numpy()


def calibrate(model, sequences: list[list[int]], q_len: int = 500) -> HeadPattern:
    """On-the-fly scores with kvpress's windows for them (sink 128, recent 256)."""
    sink, recent = ON_THE_FLY_WINDOWS
    return HeadPattern(head_scores(model, sequences, q_len).astype(float), sink, recent)


FIELDS = ("text", "article", "chapter", "context", "document")  # a JSON object's text, the first field it has


def read_texts(path: str, limit: int) -> list[str]:
    """The first `limit` calibration texts of a local file: .json (a list of strings or of objects), .jsonl (one
    string or object a line; an object's text is its first field of FIELDS), anything else one text (the file)."""
    f = Path(path).expanduser()
    if not f.is_file():
        raise ConfigError("policy.calibration", "no such file (a .txt, .json or .jsonl of texts)", path)
    raw = f.read_text()
    try:
        rows = json.loads(raw) if f.suffix == ".json" else [json.loads(x) for x in raw.splitlines() if x.strip()] \
            if f.suffix == ".jsonl" else [raw]
    except json.JSONDecodeError as e:
        raise ConfigError("policy.calibration", f"not valid JSON ({e.msg}, line {e.lineno})", path) from None
    rows = rows if isinstance(rows, list) else [rows]
    texts = [r if isinstance(r, str) else next((r[k] for k in FIELDS if isinstance(r, dict) and k in r), None)
             for r in rows[:limit]]
    if not texts or any(not isinstance(t, str) or not t for t in texts):
        raise ConfigError("policy.calibration", f"needs non-empty texts (strings, or objects with one of {FIELDS})",
                          path)
    return texts

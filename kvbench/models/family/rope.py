"""A model's RoPE as kvbench needs it, read from its config: its kind, whether re-rotating kept keys
(`policy.rerotate=true`) composes with it, and the sequence length past which its frequencies change.

Re-rotation (kvbench.cache.rotate) turns a kept key by (new slot - old slot) with transformers' rotate-half
pairing and one set of frequencies for every layer. It is refused where that is not the model's RoPE:
frequencies that change with the sequence (dynamic, longrope) or scale cos/sin (yarn, llama3_dynamic),
different RoPE per layer type, interleaved pairs (GLM-4), layers without RoPE (SmolLM3's and EXAONE 4's
NoPE layers), and queries scaled by their position (Ministral 3's `llama_4_scaling_beta`: a slot is not
the position the model scales by).
"""

from __future__ import annotations

from kvbench.errors import ConfigError
from kvbench.models.family.table import INTERLEAVED_ROPE, family_of, nope_layers, text_config

# RoPE types whose cos/sin change with the sequence length or are scaled: not a rotation that composes
NOT_A_ROTATION = ("dynamic", "longrope", "yarn", "llama3_dynamic")


def _params(config) -> dict:
    cfg = text_config(config)
    params = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    return params if isinstance(params, dict) else {}


def rope_kind(config) -> str:
    """The RoPE type ("default", "llama3", "yarn", ...; kinds per layer type joined by "+")."""
    params = _params(config)
    if params and all(isinstance(v, dict) for v in params.values()):
        kinds_ = {v.get("rope_type") or v.get("type") or "default" for v in params.values()}  # per layer type
        return "+".join(sorted(kinds_))
    return params.get("rope_type") or params.get("type") or "default"


def rope_problem(config) -> str | None:
    """Why re-rotating kept keys cannot work with this model config (None: plain RoPE, rotations compose)."""
    kind, fam = rope_kind(config), family_of(config)
    if any(k in NOT_A_ROTATION for k in kind.split("+")):
        return f"this model's RoPE is {kind}, not a plain rotation"
    if "+" in kind:
        return f"this model's layers use different RoPE ({kind})"
    if fam in INTERLEAVED_ROPE:
        return f"model family {fam!r} rotates interleaved pairs of dimensions (GPT-J style), kvbench re-rotates rotate-half pairs"
    nope = nope_layers(config)
    if nope:
        return f"layers {nope} apply no RoPE (NoPE): re-rotating their keys would add a rotation the model never applied"
    if _params(config).get("llama_4_scaling_beta"):
        return "queries are scaled by their position (llama_4_scaling_beta), which re-rotation replaces by slots"
    return None


def rope_length_limit(config) -> int | None:
    """The longest sequence over which this model's RoPE keeps one set of frequencies (None: any length).

    transformers' `dynamic` and `longrope` RoPE pick their frequencies from the largest position in each
    forward (`dynamic_rope_update`): past `original_max_position_embeddings` (longrope) or
    `max_position_embeddings` (dynamic) they change.
    """
    cfg = text_config(config)
    kinds_ = rope_kind(config).split("+")
    params = _params(config)
    if "longrope" in kinds_:
        limit = params.get("original_max_position_embeddings")
        return limit or getattr(cfg, "original_max_position_embeddings", None) or cfg.max_position_embeddings
    if "dynamic" in kinds_:
        return cfg.max_position_embeddings
    return None


def check_length_rope(config, shortest: int, longest: int, max_new_tokens: int, chunked: bool) -> None:
    """ConfigError unless kvbench computes transformers' RoPE for prompts of `shortest`..`longest` tokens.

    Past `rope_length_limit`, a prompt prefilled in several forwards (`chunked`) would see other frequencies in
    its early chunks than transformers' single forward gives every position. With longrope, transformers'
    `generate` also drops its cache and recomputes the whole sequence with the long factors at the step a
    sequence crosses the limit (Phi-3's `prepare_inputs_for_generation`), which no cache that evicts can do.
    """
    limit = rope_length_limit(config)
    if limit is None or longest + (max_new_tokens if "longrope" in rope_kind(config) else 0) <= limit:
        return
    head = f"model family {family_of(config)!r} has {rope_kind(config)} RoPE, whose frequencies change past {limit} positions"
    if "longrope" in rope_kind(config) and shortest <= limit:
        raise ConfigError("gen.max_new_tokens", f"{head}; transformers recomputes a sequence that crosses it, which "
                          f"kvbench cannot (prompts of {shortest}-{longest} tokens + {max_new_tokens} new)",
                          max_new_tokens)
    if chunked:
        raise ConfigError("gen.prefill_chunk", f"{head}; a {longest}-token prompt prefilled in chunks would not be "
                          "the model's attention (prefill it in one forward: policy.schedule=decode_only with "
                          "gen.prefill_chunk=null)", "chunked")



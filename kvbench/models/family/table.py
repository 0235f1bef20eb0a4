"""What kvbench knows about each decoder family, keyed by transformers' `model_type`: the families it runs
(and where each reads its layers' windows), their attention features, and why the others are refused.

Read from each family's transformers 5.x modeling code (docs/models.md has the table for users):

* `layer_types` families: a layer whose type is "sliding_attention" has `config.sliding_window`, the others are
  full. Their configs derive `layer_types` from older fields when a checkpoint lacks it (qwen2/qwen3:
  `use_sliding_window` and `max_window_layers`; gemma3: `sliding_window_pattern`; olmo3: 3 local, 1 global;
  exaone4: `sliding_window_pattern`; smollm3: `use_sliding_window` and its NoPE layers), so kvbench reads the
  derived list. SmolLM3's attention is windowed only when `use_sliding_window` is also set (`WINDOW_SWITCH`).
* global-window families: every layer has `config.sliding_window` (None: full attention everywhere).
* hybrid families (qwen3_5_text, qwen3_5_moe_text, qwen3_next): `layer_types` with Gated-DeltaNet
  "linear_attention" layers (transformers' own layers and state, kvbench.cache.linear_state) beside full-attention
  ones (kvbench.models.family.hybrid).
* the others: full attention in every layer.
"""

from __future__ import annotations

# how each accepted family sets its layers' windows
LAYER_TYPES, GLOBAL, NONE, HYBRID = "layer_types", "global", "none", "hybrid"
FAMILIES = {
    "llama": NONE, "olmo2": NONE, "granite": NONE, "cohere": NONE, "glm4": NONE, "glm4_moe": NONE,
    "mistral": GLOBAL, "phi3": GLOBAL, "starcoder2": GLOBAL, "mixtral": GLOBAL, "qwen3_moe": GLOBAL,
    "ministral3": GLOBAL,
    "qwen2": LAYER_TYPES, "qwen3": LAYER_TYPES, "gemma2": LAYER_TYPES, "gemma3_text": LAYER_TYPES,
    "gpt_oss": LAYER_TYPES, "ministral": LAYER_TYPES, "olmo3": LAYER_TYPES, "smollm3": LAYER_TYPES,
    "exaone4": LAYER_TYPES, "gemma4_text": LAYER_TYPES,
    "qwen3_5_text": HYBRID, "qwen3_5_moe_text": HYBRID, "qwen3_next": HYBRID,
}
SINKS = ("gpt_oss",)  # families with a learned attention sink per query head
# families whose layers may differ in (H_kv, D) (`per_layer_config`: Gemma 4's global layers); why a config is refused
PER_LAYER_SHAPES = {"gemma4_text": "num_kv_shared_layers"}
# policies that read one (H_kv, D) for the whole model (pre-RoPE query statistics, a per-head scorer or head
# pattern of L x H_kv): refused where layers differ, as are adaptive head budgets (the budgets pad H to the most heads)
ONE_SHAPE_POLICIES = ("expected_attention", "kvzap", "duo_attention")
SOFTCAP = {"gemma2": "attn_logit_softcapping"}  # families whose attention soft-caps its logits (config field)
WINDOW_SWITCH = {"smollm3": "use_sliding_window"}  # its sliding layers are windowed only when this field is true
LAYER_KINDS = ("full_attention", "sliding_attention")
LINEAR_KINDS = ("linear_attention",)  # HYBRID families: Gated-DeltaNet layers with a fixed state per sequence
INTERLEAVED_ROPE = ("cohere", "glm4")  # RoPE on interleaved pairs (x0, x1), (x2, x3)... (GPT-J style), not rotate-half

# Families researchers load whose cache is not per-layer K/V of one head size: why kvbench refuses each
_HYBRID = "hybrid model: its {what} layers (layer_types {kind!r}) hold a fixed recurrent state per sequence, " \
          "not K/V; kvbench's cache holds K/V layers only"
_MLA = "multi-head latent attention: the cache holds one compressed latent (kv_lora_rank) and one shared " \
       "rotary key (qk_rope_head_dim) per token, not K/V per head"
REFUSED = {
    "olmo_hybrid": _HYBRID.format(what="Gated-DeltaNet linear-attention", kind="linear_attention"),
    "kimi_linear": _HYBRID.format(what="Kimi-Delta-Attention linear-attention", kind="linear_attention")
    + "; its full-attention layers are multi-head latent attention",
    "minimax": _HYBRID.format(what="lightning (linear) attention", kind="linear_attention"),
    "lfm2": _HYBRID.format(what="short-convolution", kind="conv"),
    "lfm2_moe": _HYBRID.format(what="short-convolution", kind="conv"),
    "granitemoehybrid": _HYBRID.format(what="Mamba-2", kind="linear_attention"),
    "nemotron_h": _HYBRID.format(what="Mamba-2", kind="linear_attention"),
    "bamba": _HYBRID.format(what="Mamba-2", kind="linear_attention"),
    "jamba": _HYBRID.format(what="Mamba", kind="linear_attention"),
    "falcon_h1": _HYBRID.format(what="parallel Mamba-2 + attention", kind="hybrid"),
    "zamba2": _HYBRID.format(what="Mamba-2", kind="linear_attention"),
    "gemma3n_text": "its last num_kv_shared_layers layers reuse another layer's KV; kvbench's cache has one K/V per layer",
    "deepseek_v2": _MLA, "deepseek_v3": _MLA, "glm4_moe_lite": _MLA, "mistral4": _MLA, "longcat_flash": _MLA,
    "deepseek_v32": _MLA + ", with the DSA indexer's keys (layer_types 'indexed_attention') beside it",
    "glm_moe_dsa": _MLA + ", with the DSA indexer's keys (layer_types 'indexed_attention') beside it",
    "llama4_text": "chunked attention (attention_chunk_size: a query sees its own chunk only) is not implemented",
}


def text_config(config):
    """The text decoder's config of a multimodal wrapper (e.g. Gemma 3's `text_config`), else the config."""
    return getattr(config, "text_config", None) or config


def family_of(config) -> str:
    return getattr(text_config(config), "model_type", None) or type(config).__name__


def nope_layers(config) -> list[int]:
    """The layers whose attention applies no RoPE (NoPE): SmolLM3's `no_rope_layers` zeros; EXAONE 4's global
    layers when it has windowed ones."""
    cfg, fam = text_config(config), family_of(config)
    if fam == "smollm3":
        return [i for i, use in enumerate(getattr(cfg, "no_rope_layers", None) or []) if not use]
    if fam == "exaone4" and getattr(cfg, "sliding_window", None) is not None:
        return [i for i, k in enumerate(cfg.layer_types) if k != "sliding_attention"]
    return []

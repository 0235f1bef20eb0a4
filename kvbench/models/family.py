"""What kvbench knows about a model family, read from its config alone (no weights): the model adapter.

Every part that needs model knowledge reads it here: the cache geometry (query and KV heads, GQA derived
once, head size), each layer's attention kind (full, or a sliding window of W tokens), learned attention
sinks, logit soft-capping, which RoPE kinds are not a plain rotation, and which families kvbench runs.

Window semantics (transformers 5.x `masking_utils.sliding_window_overlay`): a query at position q sees
the keys at positions k with q - W < k <= q, i.e. its own token and the W - 1 before it.

Where each family's window comes from (its transformers 5.x modeling code):

* `layer_types` families (qwen2, qwen3, gemma2, gemma3_text, gpt_oss): a layer whose type is
  "sliding_attention" has `config.sliding_window`, the others are full. Their configs derive
  `layer_types` from the older fields when a checkpoint lacks it (qwen2/qwen3: `use_sliding_window`
  and `max_window_layers`; gemma3: `sliding_window_pattern`), so kvbench reads the derived list.
* global-window families (mistral, phi3, starcoder2): every layer has `config.sliding_window` (None:
  full attention everywhere).
* the others (llama, olmo2, granite, cohere): full attention in every layer.

gpt-oss adds a learned sink logit per query head to every softmax's denominator (`module.sinks`); Gemma 2
soft-caps the attention logits (`attn_logit_softcapping`: tanh(x / c) * c); both scale queries by their
own `scaling` (Gemma's `query_pre_attn_scalar`), which transformers passes to the attention function.

A family not in `FAMILIES`, or a config using a feature kvbench does not implement (chunked or
bidirectional attention, an unknown layer type), is refused by `refusal` with one line naming the family
and why, before any weight loads (kvbench.config.preflight, the loaders, and `kvbench.generate`).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.errors import ConfigError

# how each accepted family (transformers `model_type`) sets its layers' windows
LAYER_TYPES, GLOBAL, NONE = "layer_types", "global", "none"
FAMILIES = {
    "llama": NONE, "olmo2": NONE, "granite": NONE, "cohere": NONE,
    "mistral": GLOBAL, "phi3": GLOBAL, "starcoder2": GLOBAL,
    "qwen2": LAYER_TYPES, "qwen3": LAYER_TYPES, "gemma2": LAYER_TYPES, "gemma3_text": LAYER_TYPES,
    "gpt_oss": LAYER_TYPES,
}
SINKS = ("gpt_oss",)  # families with a learned attention sink per query head
SOFTCAP = {"gemma2": "attn_logit_softcapping"}  # families whose attention soft-caps its logits (config field)
LAYER_KINDS = ("full_attention", "sliding_attention")
# RoPE types whose cos/sin change with the sequence length or are scaled: not a rotation that composes
NOT_A_ROTATION = ("dynamic", "longrope", "yarn", "llama3_dynamic")


@dataclass(frozen=True)
class ModelKinds:
    """One model's attention as kvbench runs it (from its config)."""

    family: str
    q_heads: int
    kv_heads: int
    head_dim: int
    windows: tuple[int | None, ...]  # per decoder layer: the sliding window W, None for full attention
    sinks: bool = False  # learned attention sinks (gpt-oss)
    softcap: float | None = None  # attention logit soft-capping (Gemma 2)

    @property
    def gqa(self) -> bool:
        """Several query heads share each KV head."""
        return self.q_heads != self.kv_heads

    @property
    def windowed(self) -> bool:
        return any(w is not None for w in self.windows)

    @property
    def full_layers(self) -> list[int]:
        """The layers an eviction policy compresses (windowed layers keep their window)."""
        return [i for i, w in enumerate(self.windows) if w is None]

    def windows_for(self, seq_len: int) -> list[int | None]:
        """Per layer, the window that can cut something in sequences of at most `seq_len` tokens: a window
        W >= seq_len never masks a key (every q - k < W), so that layer is full attention for such a run."""
        return effective_windows(self.windows, seq_len)

    @property
    def plain(self) -> bool:
        """Causal softmax attention over every past token in every layer (what serve mode implements)."""
        return not (self.windowed or self.sinks or self.softcap is not None)

    def describe(self) -> str:
        parts = []
        if self.windowed:
            ws = sorted({w for w in self.windows if w is not None})
            parts.append(f"{len(self.windows) - len(self.full_layers)} of {len(self.windows)} layers windowed "
                         f"(W={', '.join(map(str, ws))})")
        if self.sinks:
            parts.append("learned attention sinks")
        if self.softcap is not None:
            parts.append(f"logit soft-capping {self.softcap:g}")
        return "; ".join(parts) or "full attention in every layer"


def effective_windows(windows, seq_len: int) -> list[int | None]:
    """`ModelKinds.windows_for` on a list of windows (the engine's and the account's batches)."""
    return [w if w is not None and w < seq_len else None for w in windows]


def _text(config):
    """The text decoder's config of a multimodal wrapper (e.g. Gemma 3's `text_config`), else the config."""
    return getattr(config, "text_config", None) or config


def family_of(config) -> str:
    return getattr(_text(config), "model_type", None) or type(config).__name__


def refusal(config) -> str | None:
    """Why kvbench cannot run this model exactly (one line naming the family), or None."""
    cfg = _text(config)
    fam = family_of(config)
    if fam not in FAMILIES:
        return (f"model family {fam!r} is not one kvbench runs exactly (accepted: {', '.join(sorted(FAMILIES))}); "
                "its attention was never checked against transformers' own")
    if getattr(cfg, "use_bidirectional_attention", False):
        return f"model family {fam!r} with use_bidirectional_attention=true: kvbench's attention is causal only"
    if FAMILIES[fam] == LAYER_TYPES:
        kinds = list(getattr(cfg, "layer_types", None) or [])
        if len(kinds) != cfg.num_hidden_layers:
            return f"model family {fam!r}: layer_types has {len(kinds)} entries for {cfg.num_hidden_layers} layers"
        odd = sorted({k for k in kinds if k not in LAYER_KINDS})
        if odd:
            return f"model family {fam!r}: layer type {odd[0]!r} is not implemented (kvbench runs {', '.join(LAYER_KINDS)})"
    if getattr(cfg, "attention_chunk_size", None):
        return f"model family {fam!r}: chunked attention is not implemented"
    w = getattr(cfg, "sliding_window", None)
    if FAMILIES[fam] != NONE and w is not None and int(w) < 1:
        return f"model family {fam!r}: sliding_window={w} is not a window kvbench can run"
    return None


def check(config) -> None:
    """Raise ConfigError (one line, exit code 2) for a model kvbench cannot run exactly."""
    why = refusal(config)
    if why:
        raise ConfigError("model", why, family_of(config))


def kinds(config) -> ModelKinds:
    """The model's attention as kvbench runs it (`check` first: a refused family raises ConfigError)."""
    check(config)
    cfg = _text(config)
    fam = family_of(config)
    heads = cfg.num_attention_heads
    n = cfg.num_hidden_layers
    w = getattr(cfg, "sliding_window", None)
    if w is not None and w >= getattr(cfg, "max_position_embeddings", float("inf")):
        w = None  # a window no sequence of the model reaches cuts nothing (Phi-3.5-mini's 262144)
    how = FAMILIES[fam]
    if how == LAYER_TYPES and w is not None:
        windows = tuple(int(w) if k == "sliding_attention" else None for k in cfg.layer_types)
    elif how == GLOBAL and w is not None:
        windows = (int(w),) * n
    else:
        windows = (None,) * n
    softcap = getattr(cfg, SOFTCAP[fam], None) if fam in SOFTCAP else None
    return ModelKinds(
        family=fam,
        q_heads=heads,
        kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
        windows=windows,
        sinks=fam in SINKS,
        softcap=None if softcap is None else float(softcap),
    )


def rope_kind(config) -> str:
    cfg = _text(config)
    params = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values()):
        kinds_ = {v.get("rope_type") or v.get("type") or "default" for v in params.values()}  # per layer type
        return "+".join(sorted(kinds_))
    return params.get("rope_type") or params.get("type") or "default"


def rope_problem(config) -> str | None:
    """Why re-rotating kept keys cannot work with this model config (None: plain RoPE, rotations compose)."""
    kind = rope_kind(config)
    if any(k in NOT_A_ROTATION for k in kind.split("+")):
        return f"this model's RoPE is {kind}, not a plain rotation"
    if "+" in kind:
        return f"this model's layers use different RoPE ({kind})"
    return None


def rope_length_limit(config) -> int | None:
    """The longest sequence over which this model's RoPE keeps one set of frequencies (None: any length).

    transformers' `dynamic` and `longrope` RoPE pick their frequencies from the largest position in each
    forward (`dynamic_rope_update`): past `original_max_position_embeddings` (longrope) or
    `max_position_embeddings` (dynamic) they change.
    """
    cfg = _text(config)
    kinds_ = rope_kind(config).split("+")
    params = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if "longrope" in kinds_:
        limit = params.get("original_max_position_embeddings") if isinstance(params, dict) else None
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


def check_policy(config, policy, seq_len: int | None = None) -> ModelKinds:
    """A model kvbench runs exactly under `policy` (kvbench.policies.Policy) on sequences of at most `seq_len`
    tokens (None: any), else ConfigError (one line, exit code 2): a refused family, an evicting policy on a model
    none of whose layers it could compress (every layer windowed, each window shorter than the sequences), or
    re-rotation with a windowed layer."""
    k = kinds(config)
    windows = k.windows if seq_len is None else k.windows_for(seq_len)
    if policy.evicts and all(w is not None for w in windows):
        longer = "" if seq_len is None else f" shorter than the run's {seq_len}-token sequences"
        raise ConfigError("policy", f"model family {k.family!r} has no full-attention layer ({k.describe()}{longer}): "
                          "windowed layers keep their window, so the policy would compress nothing", policy.name)
    if policy.evicts and policy.rerotate and any(w is not None for w in windows):
        raise ConfigError("policy.rerotate", f"needs full attention in every layer (model family {k.family!r}: "
                          f"{k.describe()})", True)
    return k

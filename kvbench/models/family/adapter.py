"""One model's attention as kvbench runs it, read from its config alone (no weights), or why it cannot.

Window semantics (transformers 5.x `masking_utils.sliding_window_overlay`): a query at position q sees
the keys at positions k with q - W < k <= q, i.e. its own token and the W - 1 before it.

gpt-oss adds a learned sink logit per query head to every softmax's denominator (`module.sinks`); Gemma 2
soft-caps the attention logits (`attn_logit_softcapping`: tanh(x / c) * c); both scale queries by their
own `scaling` (Gemma's `query_pre_attn_scalar`), which transformers passes to the attention function.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.errors import ConfigError
from kvbench.models.family.hybrid import LinearState, linear_state
from kvbench.models.family.rope import rope_problem
from kvbench.models.family.table import (
    FAMILIES,
    GLOBAL,
    HYBRID,
    LAYER_KINDS,
    LAYER_TYPES,
    LINEAR_KINDS,
    NONE,
    ONE_SHAPE_POLICIES,
    PER_LAYER_SHAPES,
    REFUSED,
    SINKS,
    SOFTCAP,
    WINDOW_SWITCH,
    family_of,
    text_config,
)


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
    state: LinearState | None = None  # a hybrid model's linear-attention layers (no K/V: a fixed state per sequence)
    shapes: tuple[tuple[int, int], ...] | None = None  # per layer (H_kv, D) where they differ (Gemma 4), else None

    @property
    def linear(self) -> tuple[int, ...]:
        """The linear-attention layers (no K/V; nothing to evict)."""
        return () if self.state is None else self.state.layers

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
        return [i for i, w in enumerate(self.windows) if w is None and i not in self.linear]

    def windows_for(self, seq_len: int) -> list[int | None]:
        """Per layer, the window that can cut something in sequences of at most `seq_len` tokens: a window
        W >= seq_len never masks a key (every q - k < W), so that layer is full attention for such a run."""
        return effective_windows(self.windows, seq_len)

    @property
    def plain(self) -> bool:
        """Causal softmax attention over every past token in every layer (what serve mode implements)."""
        return not (self.windowed or self.sinks or self.softcap is not None or self.linear or self.shapes)

    def describe(self) -> str:
        parts = []
        if self.windowed:
            ws = sorted({w for w in self.windows if w is not None})
            parts.append(f"{len(self.windows) - len(self.full_layers)} of {len(self.windows)} layers windowed "
                         f"(W={', '.join(map(str, ws))})")
        if self.linear:
            parts.append(f"{len(self.linear)} of {len(self.windows)} layers linear attention (a fixed state per "
                         "sequence)")
        if self.shapes:  # the paged pool has one head size
            parts.append("KV heads x head size differing by layer (" + ", ".join(sorted({f"{h} x {d}" for h, d in self.shapes})) + ")")
        if self.sinks:
            parts.append("learned attention sinks")
        if self.softcap is not None:
            parts.append(f"logit soft-capping {self.softcap:g}")
        return "; ".join(parts) or "full attention in every layer"


def effective_windows(windows, seq_len: int) -> list[int | None]:
    """`ModelKinds.windows_for` on a list of windows (the engine's and the account's batches)."""
    return [w if w is not None and w < seq_len else None for w in windows]


def split_windows(windows, seq_len: float, kv_size: int | None) -> tuple[list[int | None], list[int | None]]:
    """(kept, bands) per layer for a policy budget of `kv_size` pairs (None: no fixed budget, or no eviction) on
    sequences of at most `seq_len` tokens: `kept` the window a window group keeps (None: the policy compresses the
    layer), `bands` the window a compressed windowed layer still applies to the pairs it keeps (None elsewhere).
    A budget below a layer's window compresses that layer too; the window bounds what it may keep."""
    eff = effective_windows(windows, seq_len)
    bands = [w if w is not None and kv_size is not None and kv_size < w else None for w in eff]
    return [None if b is not None else w for w, b in zip(eff, bands, strict=True)], bands


def _layer_types_problem(cfg, fam: str) -> str | None:
    kinds_ = list(getattr(cfg, "layer_types", None) or [])
    if len(kinds_) != cfg.num_hidden_layers:
        return f"model family {fam!r}: layer_types has {len(kinds_)} entries for {cfg.num_hidden_layers} layers"
    runs = ("full_attention", *LINEAR_KINDS) if FAMILIES[fam] == HYBRID else LAYER_KINDS
    odd = sorted({k for k in kinds_ if k not in runs})
    if odd:
        return f"model family {fam!r}: layer type {odd[0]!r} is not implemented (kvbench runs {', '.join(runs)})"
    switch = WINDOW_SWITCH.get(fam)
    if switch and "sliding_attention" in kinds_ and not getattr(cfg, switch, False):
        return (f"model family {fam!r}: layer_types has sliding_attention layers but {switch}=false (transformers "
                "masks them with a window its attention is not given)")
    return None


def refusal(config) -> str | None:
    """Why kvbench cannot run this model exactly (one line naming the family), or None."""
    cfg = text_config(config)
    fam = family_of(config)
    if fam in REFUSED:
        return f"model family {fam!r} is not one kvbench runs: {REFUSED[fam]}"
    if fam not in FAMILIES:
        return (f"model family {fam!r} is not one kvbench runs exactly (accepted: {', '.join(sorted(FAMILIES))}); "
                "its attention was never checked against transformers' own")
    if fam in PER_LAYER_SHAPES and getattr(cfg, PER_LAYER_SHAPES[fam], 0):
        return (f"model family {fam!r} with {PER_LAYER_SHAPES[fam]}={getattr(cfg, PER_LAYER_SHAPES[fam])}: its last layers "
                "reuse another layer's KV; kvbench's cache has one K/V per layer")
    if getattr(cfg, "use_bidirectional_attention", False) not in (False, None, "vision"):  # "vision": text stays causal
        return f"model family {fam!r} with use_bidirectional_attention=true: kvbench's attention is causal only"
    if FAMILIES[fam] in (LAYER_TYPES, HYBRID) and (why := _layer_types_problem(cfg, fam)):
        return why
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
    cfg = text_config(config)
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
    shapes = layer_shapes(cfg, heads)
    return ModelKinds(
        family=fam,
        q_heads=heads,
        kv_heads=max(h for h, _ in shapes),  # the most KV heads of any layer (budgets (L, B, H) pad to it)
        head_dim=max(d for _, d in shapes),
        shapes=None if len(set(shapes)) == 1 else tuple(shapes),
        windows=windows,
        sinks=fam in SINKS,
        softcap=None if softcap is None else float(softcap),
        state=linear_state(cfg) if how == HYBRID else None,
    )


def layer_shapes(cfg, q_heads: int) -> list[tuple[int, int]]:
    """Per decoder layer its (H_kv, D): the config's, or each layer's `per_layer_config` (transformers' heterogeneous
    configs, Gemma 4: global layers have `global_head_dim` and, with `attention_k_eq_v`, `num_global_key_value_heads`)."""
    per = getattr(cfg, "per_layer_config", None)
    of = (lambda i: per[i]) if per is not None else (lambda i: cfg)  # noqa: E731
    return [(int(getattr(of(i), "num_key_value_heads", None) or q_heads),
             int(getattr(of(i), "head_dim", None) or cfg.hidden_size // q_heads)) for i in range(cfg.num_hidden_layers)]


def check_policy(config, policy, seq_len: int | None = None, k: ModelKinds | None = None) -> ModelKinds:
    """A model kvbench runs exactly under `policy` (kvbench.policies.Policy) on sequences of at most `seq_len`
    tokens (None: any), else ConfigError (one line, exit code 2): a refused family, an evicting policy on a model
    none of whose layers it could compress (every layer windowed, each window shorter than the sequences), or
    re-rotation with a windowed layer or a RoPE that is not one rotation of every layer's keys. `k`: the model's
    kinds when already read (the family is read once per run)."""
    k = kinds(config) if k is None else k
    windows = k.windows if seq_len is None else k.windows_for(seq_len)
    kept = split_windows(windows, float("inf"), policy.kv_size)[0] if policy.evicts else windows
    if policy.evicts and all(w is not None or i in k.linear for i, w in enumerate(kept)):
        longer = "" if seq_len is None else f" shorter than the run's {seq_len}-token sequences"
        raise ConfigError("policy", f"model family {k.family!r} has no full-attention layer ({k.describe()}{longer}) "
                          f"and the budget (kv_size={policy.kv_size}) is not below any window: windowed layers keep "
                          "their window, so the policy would compress nothing", policy.name)
    if policy.evicts and k.shapes and (policy.head_budget != "uniform" or policy.name in ONE_SHAPE_POLICIES):
        raise ConfigError("policy", f"model family {k.family!r} has {k.describe()}: {policy.name} with head_budget="
                          f"{policy.head_budget} reads one (KV heads, head size) for every layer", policy.name)
    if policy.evicts and policy.rerotate and any(w is not None for w in windows):
        raise ConfigError("policy.rerotate", f"needs full attention in every layer (model family {k.family!r}: "
                          f"{k.describe()})", True)
    if policy.evicts and policy.rerotate and k.linear:
        raise ConfigError("policy.rerotate", f"is not checked on hybrid models (model family {k.family!r}: "
                          f"{k.describe()})", True)
    if policy.evicts and policy.rerotate and (why := rope_problem(config)):
        raise ConfigError("policy.rerotate", f"needs plain RoPE: {why} (model family {k.family!r})", True)
    policy.check_model(config)
    return k

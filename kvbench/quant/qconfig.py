"""`gen.kv_cache_dtype` and its knobs, checked without a model: one ConfigError line per refusal (the preflight
calls `check_kv_cache`; kvbench.config is not changed here).

    gen.kv_cache_dtype       auto (the model's dtype, no quantization) | int8 | int4 (vLLM's name for the knob)
    gen.kv_quant_group       G: numbers per scale and zero point (keys: G tokens of one channel; values: G
                             channels of one token); it must divide the model's head_dim (each layer kind's);
                             unset (null): 32, or in mode=serve serve.block_size (kvbench.config.presets: a page
                             is its key group)
    gen.kv_quant_residual    R: the newest pairs always held in full precision (the window holds R to R + G - 1
                             once a row holds R; KIVI's window holds 0 to its R, so KIVI's R = G is kvbench's 0)

Refused, because undefined: flash with a quantized cache (flash-attn's kernel reads a full-precision cache and
no quantized-KV kernel is wired), and RoPE re-rotation of quantized keys (it rebuilds each kept key from its
full-precision copy as written, which a quantized cache does not hold).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.errors import ConfigError

KV_CACHE_DTYPES = {"auto": None, "int8": 8, "int4": 4}  # name -> bits of the codes (None: not quantized)
DEFAULT_GROUP, DEFAULT_RESIDUAL = 32, 32


@dataclass(frozen=True)
class KVQuant:
    """A quantized cache's settings, checked: `bits` 8 or 4, `group` G, `residual` R."""

    bits: int
    group: int
    residual: int


def _count(value, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def check_kv_cache(kv_cache_dtype: str = "auto", group=DEFAULT_GROUP, residual=DEFAULT_RESIDUAL, *,
                   attention: str = "auto", rerotate: bool = False, head_dim=None) -> KVQuant | None:
    """The quantized cache a run asks for (None: `auto`, the model's dtype), or a ConfigError naming the key.

    `attention`: gen.attention as resolved (flash refused with a quantized cache; `auto` must not resolve to flash
    when this returns settings); `rerotate`: policy.rerotate; `head_dim`: the model's, where known (preflight): one,
    or each layer kind's (`head_dims`) where its layers differ.
    """
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ConfigError("gen.kv_cache_dtype", f"must be one of {', '.join(KV_CACHE_DTYPES)}", kv_cache_dtype)
    bits = KV_CACHE_DTYPES[kv_cache_dtype]
    if not _count(group, 1):
        raise ConfigError("gen.kv_quant_group", "must be a positive integer", group)
    if not _count(residual, 0):
        raise ConfigError("gen.kv_quant_residual", "must be an integer >= 0", residual)
    if bits is None:
        return None
    if attention == "flash":
        raise ConfigError("gen.attention", f"flash-attn reads a full-precision cache; with gen.kv_cache_dtype="
                          f"{kv_cache_dtype} use sdpa, fused or eager", "flash")
    if rerotate:
        raise ConfigError("policy.rerotate", "re-rotation rebuilds keys from their full-precision copies, which a "
                          f"quantized cache (gen.kv_cache_dtype={kv_cache_dtype}) does not hold", True)
    dims = [] if head_dim is None else [head_dim] if isinstance(head_dim, int) else sorted(set(head_dim))
    if any(d % group for d in dims):
        raise ConfigError("gen.kv_quant_group", f"values are grouped per token over G channels: G must divide the "
                          f"model's {_dims(dims)}", group)
    if bits == 4 and any(d % 2 for d in dims):
        raise ConfigError("gen.kv_cache_dtype", f"int4 packs two codes a byte: the model's {_dims(dims)} is odd",
                          kv_cache_dtype)
    return KVQuant(bits, group, residual)


def _dims(dims: list[int]) -> str:
    """One head size, or every layer kind's where they differ (Gemma 4: "head_dims 256 and 512 (its layers differ)")."""
    return f"head_dim {dims[0]}" if len(dims) == 1 else f"head_dims {' and '.join(map(str, dims))} (its layers differ)"


def head_dims(shape) -> list[int]:
    """Every layer kind's head size of a model (kvbench.models.family.ModelKinds or kvbench.memory.ModelShape: Gemma
    4's sliding and global layers differ), the group must divide each."""
    return sorted({d for _, d in shape.shapes}) if shape.shapes else [shape.head_dim]


def kv_quant(gen, *, rerotate: bool = False, head_dim=None) -> KVQuant | None:
    """`check_kv_cache` on a run's `gen` config node (keys absent, as in records older than the knob: defaults)."""
    group = gen.get("kv_quant_group")  # null (not resolved by kvbench.config.presets): the default
    return check_kv_cache(gen.get("kv_cache_dtype", "auto"), DEFAULT_GROUP if group is None else group,
                          gen.get("kv_quant_residual", DEFAULT_RESIDUAL), attention=gen.get("attention", "auto"),
                          rerotate=rerotate, head_dim=head_dim)


def unused_knobs(gen) -> list[str]:
    """The quantized cache's knobs set away from their defaults while `gen.kv_cache_dtype` is auto: nothing is
    quantized, so they play no part (a single run refuses them, a sweep resets them and names them ignored, as
    it does a policy's unused keys: kvbench.config)."""
    if gen.get("kv_cache_dtype", "auto") != "auto":
        return []
    return [f"gen.{k}" for k, d in (("kv_quant_group", DEFAULT_GROUP), ("kv_quant_residual", DEFAULT_RESIDUAL))
            if gen.get(k) not in (None, d)]

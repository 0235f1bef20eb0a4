"""The `flash` backend: flash-attn's kv-cache kernel on kvbench's cache (CUDA, half precision, `flash` extra).

It reads the cache's own storage (no copy) and returns the output only; statistics come from the separate
pass in `kvbench.attention.pair_weights`, as for SDPA. The first call of a process is checked against SDPA on the
real cache (this path had no GPU to be tested on when written): `_checked` remembers that the installed
kernel passed, a fact about the library, like the availability probe in `kvbench.attention.backend_choice`.
"""

from __future__ import annotations

from kvbench.attention import sdpa
from kvbench.attention.unsupported import AttentionError

FLASH_CHECK_TOL = 2e-2  # max |flash - SDPA| - FLASH_CHECK_RTOL |SDPA| accepted on the first flash call of a process
FLASH_CHECK_RTOL = 1.6e-2  # 2 ulps of bfloat16 (torch.testing's bfloat16 rtol)
_checked = {"flash": False}  # the first call of the process was compared with SDPA and agreed


def flash_attention(query, key, value, step, scaling):
    """flash-attn's kv-cache kernel: query (B, Hq, T, D), key/value (B, H_kv, N, D); returns (B, Hq, T, D).

    With causal=True it aligns each sample's mask bottom-right on its own `cache_seqlens`: query i
    sees slots <= n_b - T + i, which is exactly kvbench's mask since real queries are right-aligned
    in the chunk (pad rows may see nothing; flash returns zeros for them, they are discarded).
    """
    from flash_attn import flash_attn_with_kvcache  # the optional `flash` extra

    out = flash_attn_with_kvcache(
        query.transpose(1, 2),  # (B, T, Hq, D)
        key.transpose(1, 2),  # (B, N, H_kv, D), a strided view of the cache
        value.transpose(1, 2),
        cache_seqlens=step.seqlens,  # (B,) int32
        softmax_scale=scaling,
        causal=True,
        window_size=(-1, -1) if step.window is None else (step.window - 1, 0),  # the slots are consecutive positions
    ).transpose(1, 2)  # (B, Hq, T, D)
    if not _checked["flash"]:
        ref = sdpa.sdpa_attention(query, key, value, step, scaling)  # (B, Hq, T, D)
        real = step.real[:, None, :, None]  # (B, 1, T, 1): compare real queries only
        # |diff| beyond a relative part (two kernels' roundings: bfloat16's ulp at 4.0 is 0.031)
        err = (((out - ref).abs() - FLASH_CHECK_RTOL * ref.abs()) * real).max().item()
        if not err <= FLASH_CHECK_TOL:
            raise AttentionError(f"flash-attn disagrees with SDPA on kvbench's cache (max |diff| - "
                                 f"{FLASH_CHECK_RTOL:g} |SDPA| = {err:.3g}): use the sdpa backend")
        _checked["flash"] = True
    return out

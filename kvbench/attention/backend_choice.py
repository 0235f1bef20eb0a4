"""Which attention backend a run uses (`gen.attention`), and whether flash-attn can run here.

The choice is made once per run, before the first forward, from the device, the dtype, whether the policy
needs attention statistics, whether its heads may hold different counts (a mask per KV head, which flash-attn
takes not), and whether the model's attention has sinks or soft-capping (no SDPA or flash kernel does either). A
backend that cannot run is `UnsupportedBackend` (kvbench.attention.unsupported; the config checks name the key). The record and the memory account name the backend `resolve` returns, so this is the
only place that decides it.

flash-attn is "available" when a device type it supports is present and one tiny kernel call succeeds (a
wheel built for another torch may import and fail at its first call); that verdict is probed once per
device per process (`_flash_works`), a fact about the installed library, not about a run.
"""

from __future__ import annotations

import torch

from kvbench.attention.unsupported import UnsupportedBackend

BACKENDS = ("auto", "sdpa", "flash", "eager", "fused")
FLASH_DEVICES = {"cuda"}  # device types flash-attn runs on (tests add "cpu" with a stand-in kernel)
_flash_works: dict[str, bool] = {}  # device -> the probe's verdict, once per process


def _flash_probe(device: torch.device) -> bool:
    """flash-attn imports AND runs: one tiny `flash_attn_with_kvcache` call in float16 (a wheel built for another
    torch imports, or not, and fails at its first call: then kvbench falls back instead of failing mid-run)."""
    try:
        from flash_attn import flash_attn_with_kvcache

        q = torch.zeros(1, 1, 1, 64, dtype=torch.float16, device=device)  # (B, T, Hq, D)
        kv = torch.zeros(1, 2, 1, 64, dtype=torch.float16, device=device)  # (B, N, H_kv, D)
        seqlens = torch.full((1,), 2, dtype=torch.int32, device=device)  # (B,)
        flash_attn_with_kvcache(q, kv, kv, cache_seqlens=seqlens, causal=True)
        return True
    except Exception:  # ImportError, an undefined symbol (OSError), a kernel error: all mean "not usable here"
        return False


def flash_available(device: str | torch.device = "cuda") -> bool:
    """flash-attn can run on `device` (a type or a device): a device type it supports, present, and working."""
    device = torch.device(device)
    if device.type not in FLASH_DEVICES or (device.type == "cuda" and not torch.cuda.is_available()):
        return False
    key = str(device)
    if key not in _flash_works:
        _flash_works[key] = _flash_probe(device)
    return _flash_works[key]


def check(backend: str, uneven: bool) -> None:
    """UnsupportedBackend when `backend` cannot run a policy whose heads hold different counts (`uneven`)."""
    if uneven and backend == "flash":
        raise UnsupportedBackend("flash", "flash-attn takes no per-head mask: head budgets that differ by head "
                                 "(head_budget=adaptive) run with sdpa, eager or fused")


def resolve(backend: str, *, device_type: str, dtype: torch.dtype, needs_attention: bool, manual: bool = False,
            uneven: bool = False) -> str:
    """The backend a run really uses (what its record and the memory account name).

    auto: on the CPU, `fused` for a policy that needs statistics (measured faster than SDPA + the
    statistics pass: README, Benchmarks); otherwise flash-attn when installed, on CUDA, in half
    precision, else SDPA (on CUDA, fused vs SDPA + statistics is not measured yet, so SDPA stays).
    `fused` for a policy that needs no statistics is SDPA (there is nothing to fuse).
    `manual`: the model's attention has sinks or soft-capping (no SDPA or flash kernel does both): `fused`
    unless `eager` was asked for. `uneven`: the policy's heads may hold different counts: never flash (auto: SDPA;
    flash asked for: UnsupportedBackend).
    """
    check(backend, uneven)
    if manual:
        return "eager" if backend == "eager" else "fused"
    if backend == "auto":
        if needs_attention and device_type == "cpu":
            return "fused"
        half = dtype in (torch.float16, torch.bfloat16)
        return "flash" if half and not uneven and flash_available(device_type) else "sdpa"
    if backend == "fused" and not needs_attention:
        return "sdpa"
    return backend


def resolve_backend(backend: str, model, needs_attention: bool = False, uneven: bool = False, kinds=None) -> str:
    """`resolve` for a loaded model; `kinds`: its attention kinds (kvbench.models.family), read when not given."""
    if kinds is None:
        from kvbench.models.family import kinds as read

        kinds = read(model.config)
    return resolve(backend, device_type=model.device.type, dtype=model.dtype, needs_attention=needs_attention,
                   manual=kinds.sinks or kinds.softcap is not None, uneven=uneven)

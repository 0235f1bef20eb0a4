"""kvbench.memory.cap: the memory limit becomes each GPU's per-process fraction (less the reserve, at most 1),
and None lifts it, on every visible device; without CUDA nothing is called. CUDA is faked: the calls are
what is checked."""

from __future__ import annotations

import types

import torch

from kvbench.memory import cap
from kvbench.memory.accounting import GiB
from kvbench.memory.limit import MemoryLimit


def fake_cuda(monkeypatch, totals):
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: bool(totals))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(totals))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(total_memory=totals[i]))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, i: calls.append((i, f)))
    return calls


def test_fraction_per_device_and_lifted(monkeypatch):
    calls = fake_cuda(monkeypatch, [8 * GiB, 2 * GiB])
    cap.apply_cuda_cap(MemoryLimit(gb=3.0, reserve_gb=1.0))
    assert calls == [(0, 0.25), (1, 1.0)]  # 2 GiB usable of 8; of 2 it is all (never above 1)
    calls.clear()
    cap.apply_cuda_cap(None)
    assert calls == [(0, 1.0), (1, 1.0)]


def test_no_cuda_no_call(monkeypatch):
    calls = fake_cuda(monkeypatch, [])
    cap.apply_cuda_cap(MemoryLimit(gb=1.0))
    assert calls == []

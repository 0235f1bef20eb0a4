"""kvbench.run.static (mode=run): a fixed batch larger than the data is clamped and said; the searched batch
is the search's, recorded with its trials; nothing fitting is an accounted or measured OutOfMemory."""

from __future__ import annotations

import types

import pytest
from omegaconf import OmegaConf

from kvbench import search
from kvbench.errors import OutOfMemory
from kvbench.run import static


def _record():
    return {"notes": [], "batch_size": None, "search": None, "peak_mem_bytes": None, "accounted_mem_bytes": None}


@pytest.mark.parametrize("asked, n, ran", [(8, 3, 3), (3, 3, 3), (2, 5, 2)])
def test_a_fixed_batch_is_clamped_to_the_data(asked, n, ran):
    rec = _record()
    assert static.clamp_batch_size(rec, asked, n) == ran and rec["batch_size"] == ran
    assert len(rec["notes"]) == (asked > n) and (asked <= n or f"batch_size={asked}" in rec["notes"][0])


def _fake_search(monkeypatch, fits: set[int], candidates=(1, 2, 4, 8)):
    def max_batch(cfg, lm, policy, ids, memory_limit):
        def trial(b):
            ok = b in fits
            return search.Trial(b, "ok" if ok else "oom", peak_mem_bytes=100 * b, accounted_mem_bytes=90 * b,
                                oom_kind=None if ok else "accounted")
        return search.search(list(candidates), trial)

    monkeypatch.setattr(search, "max_batch", max_batch)


def test_the_searched_batch_and_its_peak_are_recorded(monkeypatch):
    _fake_search(monkeypatch, fits={1, 2, 4})
    rec = _record()
    assert static.search_batch_size(None, rec, None, None, [], None) == 4
    assert rec["batch_size"] == 4 and rec["search"]["first_oom_batch_size"] == 8
    assert (rec["peak_mem_bytes"], rec["accounted_mem_bytes"]) == (400, 360)  # the largest batch that fit


def test_nothing_fits_is_an_out_of_memory_at_the_smallest_batch(monkeypatch):
    _fake_search(monkeypatch, fits=set())
    rec = _record()
    with pytest.raises(OutOfMemory, match="not even batch size 1") as e:
        static.search_batch_size(None, rec, None, None, [], None)
    assert e.value.kind == "accounted" and rec["batch_size"] == 1 and rec["search"]["max_batch_size"] is None


@pytest.mark.parametrize("warmup, device, want", [(None, "cpu", False), (None, "cuda", True), (True, "cpu", True),
                                                   (False, "cuda", False)])
def test_warmup_defaults_to_cuda_only(warmup, device, want):
    cfg = OmegaConf.create({"gen": {"warmup": warmup}})
    model = types.SimpleNamespace(device=types.SimpleNamespace(type=device))
    assert static.warmup_of(cfg, model) is want

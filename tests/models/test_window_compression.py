"""A policy budget below a layer's sliding window compresses that layer too (kvbench.cache.band): models whose every
layer is windowed (Phi-3-mini-4k, Mistral-7B-v0.1) run eviction policies on sequences longer than their window.

The window then masks by each kept pair's position (slots no longer hold consecutive positions): with no eviction
at all, that mask gives transformers' own tokens; under H2O and Batch-Max every windowed layer stays within the
budget at every forward; pairs outside every later query's window are evicted first; a budget at or above the
window leaves the window groups alone and is refused as before (nothing to compress).
"""

from __future__ import annotations

import pytest
import torch

from kvbench.cache import band
from kvbench.engine import batch as engine_batch
from kvbench.errors import ConfigError
from kvbench.models import family
from kvbench.policies import H2O, BatchMax
from tests.models.test_family import NEW, hf_generate, model, run

CHUNK = 8
WINDOWED = ("phi3-window", "mistral-window")  # every layer windowed: W=24 and W=16, shorter than the 80-token run


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in (70, 57)]


@pytest.mark.parametrize("arch", WINDOWED)
@pytest.mark.parametrize("chunk", [None, CHUNK])
def test_the_position_band_is_transformers_window(arch, chunk, prompts, monkeypatch):
    """Every windowed layer run as a compressed one (band groups of the full cache's capacity, nothing evicted):
    the window applied by position gives transformers' tokens, whole prompt and chunked."""
    lm = model(arch)
    split = family.split_windows

    def every_layer_banded(windows, seq_len, kv_size):
        kept, _ = split(windows, seq_len, None)
        return [None] * len(kept), kept

    monkeypatch.setattr(engine_batch.family, "split_windows", every_layer_banded)
    seen = []
    out = run(lm, prompts, prefill_chunk=chunk, observer=lambda ev, c: seen.append([g.band for g in c.groups]))
    assert out.token_ids == hf_generate(lm.model, prompts)
    assert seen and all(b == family.kinds(lm.model.config).windows[0] for step in seen for b in step)


POLICIES = {
    "h2o": lambda k: H2O(kv_size=k, evict_every=1, schedule="prefill_and_decode"),
    "batch_max": lambda k: BatchMax(kv_size=k, evict_every=8),
}


@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("arch", WINDOWED)
def test_a_budget_below_the_window_compresses_windowed_layers(arch, name, prompts):
    lm = model(arch)
    W = family.kinds(lm.model.config).windows[0]
    policy = POLICIES[name](W - 4)
    seen = []

    def watch(ev, c):
        seen.append([(g.sliding, g.band, int(g.n.max()), int(g.budget.max())) for g in c.groups])
        for g in c.groups:  # after an eviction every held pair a later query sees is inside its window
            for i in range(len(g.layers)):
                for b in range(c.batch_size_):
                    pos = g.pos[i, b, :, : int(g.n[b])]
                    if ev == "evict" and int(g.n[b]) and int(c.seen[b]) > W:
                        inside = int((pos > int(c.seen[b]) - W).sum(dim=-1).min())
                        assert inside == min(int(g.n[b]), W - 1) or inside >= policy.kv_size - policy.evict_every

    out = run(lm, prompts, policy, prefill_chunk=CHUNK, observer=watch)
    assert [len(t) for t in out.token_ids] == [NEW, NEW]
    assert seen and all(s is None and b == W and n <= k for step in seen for s, b, n, k in step)
    assert max(n for _, _, n, _ in seen[-1]) <= policy.kv_size < W
    alone = run(lm, [prompts[1]], policy, prefill_chunk=CHUNK)
    assert out.token_ids[1] == alone.token_ids[0]


def test_a_budget_not_below_the_window_is_refused(prompts):
    lm = model("mistral-window")  # W=16
    with pytest.raises(ConfigError, match="no full-attention layer .* not below any window"):
        run(lm, prompts, H2O(kv_size=16))


def test_record_names_the_compressed_windowed_layers():
    kept, bands = family.split_windows([24, 24, None], 80, 16)
    assert kept == [None, None, None] and bands == [24, 24, None]
    kept, bands = family.split_windows([24, 24, None], 80, 24)
    assert kept == [24, 24, None] and bands == [None, None, None]
    kept, bands = family.split_windows([24, 100], 80, 16)  # a window the run never reaches is full attention
    assert kept == [None, None] and bands == [24, None]


def test_out_of_window_pairs_rank_below_every_visible_one():
    pos = torch.tensor([0, 5, 30, 31, 32, 0]).view(1, 1, 1, 6)
    ranked = torch.tensor([9.0, 8.0, 1.0, 2.0, 3.0, -float("inf")]).view(1, 1, 1, 6)
    out = band.out_of_window(ranked, pos, torch.tensor(32).view(1, 1, 1, 1), 8)  # next query 33 sees 26..33
    assert out[..., :2].max() < out[..., 2:5].min() and out[..., 5] == -float("inf") and out[..., 0] > out[..., 5]

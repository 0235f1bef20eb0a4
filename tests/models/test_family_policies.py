"""H2O and Batch-Max under `prefill_and_decode` on every family of the family matrix (tests/models/test_family.py's
tiny models, the same padded batch of a 70- and a 57-token prompt, prefilled in chunks of 8).

Each policy holds every full-attention layer within its budget at every forward (Algorithm 1 evicts before the
cache would overflow), windowed layers keep their window (+ the forward's chunk), the cache ends compressed, and
the batch's padded sample gets the tokens it gets alone: neither the padding nor the other sample reaches its
scores, whatever the family's attention (q/k norms, partial or interleaved RoPE, NoPE layers, a position-scaled
query, MoE MLPs). A model whose every layer is windowed for these sequences is refused instead (nothing to
compress).
"""

from __future__ import annotations

import pytest
import torch

from kvbench.errors import ConfigError
from kvbench.models import family
from kvbench.policies import H2O, BatchMax
from tests.models.test_family import ARCHS, NEW, model, run

POLICIES = {
    "h2o": lambda: H2O(kv_size=24, evict_every=1, schedule="prefill_and_decode"),
    "batch_max": lambda: BatchMax(kv_size=24, evict_every=8),  # prefill_and_decode, its published schedule
}
CHUNK = 8


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in (70, 57)]


@pytest.mark.parametrize("name", POLICIES)
@pytest.mark.parametrize("arch", ARCHS)
def test_h2o_and_batch_max_compress_every_family(arch, name, prompts):
    lm, policy = model(arch), POLICIES[name]()
    assert policy.schedule == "prefill_and_decode"
    kinds = family.kinds(lm.model.config)
    if all(w is not None for w in kinds.windows_for(70 + NEW)):
        with pytest.raises(ConfigError, match="no full-attention layer"):
            run(lm, prompts, policy, prefill_chunk=CHUNK)
        return
    seen = []
    out = run(lm, prompts, policy, prefill_chunk=CHUNK,
              observer=lambda ev, c: seen.append([(g.sliding, g.layers, int(g.n.max()), g.budget) for g in c.groups]))
    assert [len(t) for t in out.token_ids] == [NEW, NEW]
    for sliding, layers, n, budget in (g for step in seen for g in step):
        if sliding is None:  # the policy's layers: within the budget at every forward
            assert all(kinds.windows[i] is None for i in layers) and n <= int(budget.max()), (arch, layers, n)
        else:  # a windowed layer keeps its window, whatever the policy
            assert all(kinds.windows[i] == sliding for i in layers) and n <= sliding - 1 + CHUNK
    assert max(n for sliding, _, n, _ in seen[-1] if sliding is None) < 70 + NEW - 1  # compressed
    alone = run(lm, [prompts[1]], policy, prefill_chunk=CHUNK)
    assert out.token_ids[1] == alone.token_ids[0], arch

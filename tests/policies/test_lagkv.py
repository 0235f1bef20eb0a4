"""LagKV against its brute-force rule (tests/reference_methods.py's `lagkv`, proven against kvpress 0.5.5's
LagKVPress): the score of every slot of a left-padded batch (samples of different lengths, short and long), the
engine's kept pairs and tokens under after_prefill at lag 8, and the schedules it refuses."""

from __future__ import annotations

import pytest
import torch

from kvbench.errors import ConfigError
from kvbench.policies import LagKV
from kvbench.policies.policy import ScoreContext
from tests import reference as R
from tests.policies.test_scored import PROMPTS, assert_traces_match, reference, run_engine
from tests.reference_methods import lagkv

LENGTHS = (61, 36, 19, 44)  # lag 8, sink 4: long (several partitions), 4 partitions, short (< 20), odd remainder


def context(lengths, L=2, H=2, D=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    N, B = max(lengths), len(lengths)
    k = torch.randn(L, B, H, N, D, generator=g, dtype=torch.float64)
    v = torch.randn(L, B, H, N, D, generator=g, dtype=torch.float64)
    n = torch.tensor(lengths).view(1, B, 1, 1)
    pos = torch.arange(N).expand(L, B, H, N)
    return ScoreContext(pos=pos, last=n - 1, n=n, keys=k, values=v)


def rule(ctx, layer, b, lag, n_sink=4):
    n = int(ctx.n.view(-1)[b])
    heads = [[R.Pair(i, ctx.keys[layer, b, h, i], ctx.values[layer, b, h, i]) for i in range(n)]
             for h in range(ctx.keys.shape[2])]
    return lagkv(None, heads, n_sink, lag)


def test_scores_every_sample_of_a_padded_batch_as_the_rule():
    ctx = context(LENGTHS)
    got = LagKV(kv_size=8, lag_size=8).score(ctx)
    for layer in range(2):
        for b, n in enumerate(LENGTHS):
            want = torch.tensor(rule(ctx, layer, b, 8), dtype=torch.float64)
            assert torch.allclose(got[layer, b, :, :n].double(), want, atol=1e-6), (layer, b)
    assert (got[:, 0, :, 4:44] < 1).any()  # the ranked partitions are there


def test_a_constant_channel_gives_finite_scores():
    ctx = context((44,))
    ctx.keys[:, :, :, :, 2] = 0.5  # kvpress divides by zero here
    got = LagKV(kv_size=8, lag_size=8).score(ctx)
    assert torch.isfinite(got).all()
    ctx.keys[:, :, :, :, 2] = torch.randn(1, dtype=torch.float64)  # a constant channel adds nothing to the spread:
    assert torch.equal(LagKV(kv_size=8, lag_size=8).score(ctx), got)  # any constant gives the same ranks


def test_engine_keeps_the_rules_pairs_and_tokens_at_batch_4(tiny_llama):
    policy = LagKV(kv_size=12, lag_size=8)
    spec = R.Spec(rule="lagkv", kv_size=12, evict_every=policy.evict_every, schedule="after_prefill", lag=8)
    refs = [reference("llama", tuple(p), spec) for p in PROMPTS]
    assert all(ref.evictions for ref in refs)
    assert_traces_match(refs, *run_engine(tiny_llama, PROMPTS, policy, 4)[:3])


@pytest.mark.parametrize("schedule", ["prefill_and_decode", "decode_only"])
def test_schedules_that_evict_while_running_are_refused(schedule):
    with pytest.raises(ConfigError, match="policy.schedule"):
        LagKV(schedule=schedule)


def test_bfloat16_ranks_are_a_permutation_in_every_partition():
    ctx = context((44,))
    ctx.keys, ctx.values = ctx.keys.bfloat16(), ctx.values.bfloat16()
    got = LagKV(kv_size=8, lag_size=8).score(ctx)  # float32 ranks from bfloat16 spreads, as kvpress computes them
    parts = got[..., 4:36].reshape(2, 1, 2, 4, 8).sort(dim=-1).values  # 4 ranked partitions of 8
    assert torch.equal(parts, (torch.arange(8) / 8).expand_as(parts))
    assert (got[..., :4] == 1).all() and (got[..., 36:] == 1).all()  # sinks, the last partition and the rest

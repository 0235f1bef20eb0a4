"""Compactor (kvbench.policies.compactor) against kvpress 0.5.5 and the brute-force rule (tests/reference_methods's
`compactor` through tests/reference_generate): after_prefill keeps kvpress's pairs and decodes its tokens on
kvpress's tiny model (chunks of 16, the sketch seeded 3); a left-padded batch keeps, row by row, what each prompt
alone keeps under the rule, per-head topk and AdaKV's split (the leaderboard's adakv_compactor); the scores in
bfloat16 follow float64's; the schedules and settings it is not defined under are refused."""

from __future__ import annotations

import pytest
import torch

from kvbench.config import prepare
from kvbench.errors import ConfigError
from kvbench.policies.compactor import Compactor, leverage, non_causal, sketch, zscore
from tests import kvpress_tiny as T
from tests import reference as R
from tests import reference_generate as G
from tests import reference_methods as M
from tests import reference_select as S
from tests.memory.test_account import _compose
from tests.policies.test_expected_attention import run, tiny  # the tiny kvpress model and a run's kept pairs
from tests.policies.test_reference_methods import fixture


def test_after_prefill_keeps_kvpress_pairs_and_tokens():
    fx = fixture("compactor")
    policy = Compactor(kv_size=None, compression_ratio=fx["ratio"], chunk_size=16, seed=fx["sketch_seed"])
    tokens, kept = run(tiny(), [fx["ids"]], policy, len(fx["tokens"]))
    assert kept[0] == fx["kept"]
    assert tokens[0] == fx["tokens"]


PROMPTS = [T.prompt_ids(61, seed=1), T.prompt_ids(27, seed=4), T.prompt_ids(44, seed=7)]  # 3, 1 and 2 chunks of 16


def adakv_compactor(ctx, ratio, seed, chunk, alpha):
    """The leaderboard's AdaKVPress(CompactorPress()): the rule's scores, AdaKV's selection."""
    sk = G.sketches(ctx, seed)
    return G.per_layer(ctx, lambda la: M.compactor(ctx.ref, la, ctx.cache[la], ctx.hidden[la], sk[la], ratio,
                                                   chunk=chunk), lambda s: S.adakv(s, ratio, alpha))


@pytest.mark.parametrize("head_budget", ["uniform", "adaptive"])
def test_left_padded_batch_keeps_the_rule_row_by_row(head_budget):
    model = tiny()
    policy = Compactor(kv_size=None, compression_ratio=0.5, chunk_size=16, seed=5, head_budget=head_budget)
    tokens, kept = run(model, PROMPTS, policy, 4)
    ref = R.ReferenceModel(model)
    for ids, tok, k in zip(PROMPTS, tokens, kept, strict=True):
        if head_budget == "uniform":
            want_tokens, want_kept = G.generate(ref, ids, 4, "compactor", 0.5, seed=5, chunk=16)
        else:
            ctx = G.prefill(ref, ids)
            want_kept = adakv_compactor(ctx, 0.5, 5, 16, policy.head_floor)
            want_tokens, _ = G.generate(ref, ids, 4, None, keep=want_kept)
        assert k == want_kept and tok == want_tokens
    if head_budget == "adaptive":  # the split is AdaKV's: heads hold different counts
        assert any(len(h) != len(layer[0]) for k in kept for layer in k for h in layer)


def test_sketch_is_the_seeded_generators_draws_in_layer_order():
    g = torch.Generator().manual_seed(11)
    draws = [torch.randn(1, 2, 8, 4, generator=g)[0] for _ in range(3)]
    for layer in (2, 0, 1):  # asked in any order: layer l is still the l-th draw
        assert torch.equal(sketch(11, layer, 2, 8, 4), draws[layer])


def test_bfloat16_scores_follow_float64():
    g = torch.Generator().manual_seed(0)
    B, H, Hq, M_, D = 2, 2, 4, 40, 16
    q, k, v = (torch.randn(B, h, M_, D, generator=g, dtype=torch.float64) for h in (Hq, H, H))
    q = q / 2  # unscaled logits of a few units, as a model's
    valid = (torch.arange(M_) < torch.tensor([40, 29])[:, None])[:, None]  # (B, 1, M): row 1 padded
    q, k, v = (x.masked_fill(~valid[..., None], 0) for x in (q, k, v))
    phi = torch.randn(H, D, 48, generator=g, dtype=torch.float64)
    for name, f in (("leverage", lambda x, dt: leverage(x[1], valid, phi.to(dt), True)),
                    ("attention", lambda x, dt: non_causal(*x, valid, 16))):
        want = zscore(f((q, k, v), torch.float64).float(), valid, True)
        got = zscore(f(tuple(x.bfloat16() for x in (q, k, v)), torch.bfloat16), valid, True)
        assert torch.isfinite(got).all(), name
        assert (got - want).masked_fill(~valid, 0).abs().max() < 0.15, name  # z-scores: a few bf16 ulps of spread
        top = lambda s: set(s[1, 0, :29].topk(14).indices.tolist())  # noqa: E731
        assert len(top(got) & top(want)) >= 12, name


def test_kv_size_blends_by_each_rows_evicted_share():
    p = Compactor(kv_size=30)
    assert torch.allclose(p.blend(torch.tensor([60, 20])).view(-1), torch.tensor([0.5, 0.0]))
    assert "blending: the share of each row's prompt its kv_size evicts (kvpress: the compression ratio)" in (
        p.describe()["extensions"])
    assert Compactor(kv_size=None, compression_ratio=0.25).blend(torch.tensor([60])).item() == 0.25


@pytest.mark.parametrize("schedule", ["prefill_and_decode", "decode_only"])
def test_schedules_that_evict_while_running_are_refused(schedule):
    with pytest.raises(ConfigError, match="policy.schedule"):
        Compactor(schedule=schedule)


def test_chunked_prefill_is_refused():
    cfg = _compose("model=tiny-llama", "policy=compactor", "gen.prefill_chunk=64")
    with pytest.raises(ConfigError) as refused:
        prepare(cfg)
    assert refused.value.key == "gen.prefill_chunk"
    prepare(_compose("model=tiny-llama", "policy=compactor", "policy.kv_size=null", "gen.prefill_chunk=64"))  # no eviction


def test_serve_feeds_a_prompt_whole_and_refuses_one_longer_than_a_step():
    """Serve mode's scheduler waits for a step with room for a whole prompt (the preempted-request test of
    tests/serve/test_engine.py checks the tokens); a prompt longer than a step can never be fed."""
    from kvbench.serve.block_evict import BlockRule
    from kvbench.serve.blocks import BlockManager
    from kvbench.serve.engine import serve
    from kvbench.serve.request import Request
    from kvbench.serve.scheduler import Scheduler

    policy = Compactor(kv_size=None, compression_ratio=0.5)
    sched = Scheduler(BlockManager(64, 4, (2, 2)), BlockRule.of(policy, 4), max_tokens_per_step=30)
    for i, n in enumerate((20, 16, 8)):
        sched.add(Request(rid=i, prompt=[1] * n, max_new_tokens=4))
    steps = []
    for _ in range(2):  # as kvbench.serve.limits.replay advances them
        plan = sched.schedule().scheduled
        steps.append([(s.req.rid, s.num_tokens) for s in plan])
        for s in plan:
            s.req.num_computed += s.num_tokens
            sched.bm.advance(s.req, s.num_tokens)
            if s.req.num_computed == s.req.seq_len:
                s.req.output.append(0)
    assert steps == [[(0, 20)], [(0, 1), (1, 16), (2, 8)]]  # request 1 waits for room for its whole prompt
    with pytest.raises(ConfigError) as refused:
        serve(tiny(), [Request(rid=0, prompt=PROMPTS[0], max_new_tokens=2)], policy, num_blocks=64, block_size=4,
              max_tokens_per_step=32)
    assert refused.value.key == "serve.max_tokens_per_step"

"""ChunkKV over SnapKV against the brute-force rule (tests/reference.py's "chunkkv"): kept pairs and tokens of a
left-padded batch under after_prefill with chunks of 8; its budget in whole chunks (kvpress's count), what it
refuses, and that the inner policy is any registered one."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from kvbench import budgets
from kvbench.errors import ConfigError
from kvbench.policies import ChunkKV
from tests.policies.test_scored import PROMPTS, assert_traces_match, reference, run_engine, spec_of
from tests.reference_select import chunkkv as kvpress_chunks


def test_engine_keeps_the_rules_chunks_and_tokens_at_batch_4(tiny_llama):
    policy = ChunkKV(kv_size=32, chunk_length=8, inner_args={"window": 10})  # prompts 70, 24, 45, 13
    refs = [reference("llama", tuple(p), spec_of(policy)) for p in PROMPTS]
    assert [len(r.final[0][0]) for r in refs] == [24 + 6 + 23, 24 + 23, 24 + 5 + 23, 13 + 23]  # 4 chunks, the newest partial
    assert_traces_match(refs, *run_engine(tiny_llama, PROMPTS, policy, 4)[:3])


def test_budget_is_kvpress_count_of_whole_chunks():
    """At compression_ratio the kept pairs are those of kvpress's max(1, int(chunks (1 - r))) chunks when the newest
    ranks among them (scores rising with the index: it does)."""
    for n in (20, 37, 60, 61, 199, 1000):
        for r in (0.25, 0.5, 0.75, 0.9):
            policy = ChunkKV(compression_ratio=r)
            got = int(budgets.layer_budgets(policy, [n], 2)[0, 0])
            want = len(kvpress_chunks([list(range(n))], r, 20)[0])
            assert got == want, (n, r)


def test_budget_at_or_above_the_prompt_evicts_nothing(tiny_llama):
    """A budget of the whole prompt (kv_ratio=1.0) or more (kv_size = prompt + 1) keeps every chunk, the newest
    (partial) one at its own length: the full cache's tokens (issue 58: it counted the partial chunk as whole)."""
    from kvbench.engine import generate
    from kvbench.policies import Full

    for prompts, policy in (([PROMPTS[0], PROMPTS[2]], ChunkKV(kv_ratio=1.0)),  # 70 and 45 pairs: chunks of 20,
                            ([PROMPTS[0], PROMPTS[2]], ChunkKV(kv_size=71)),  # the newest of 10 and 5
                            ([PROMPTS[2]], ChunkKV(kv_size=46))):
        n = [len(p) for p in prompts]
        assert budgets.layer_budgets(policy, n, 1)[0].tolist() == [max(k, policy.kv_size or 0) for k in n]
        args = (tiny_llama.model, tiny_llama.tokenizer, prompts)
        full = generate(*args, Full(), len(prompts), max_new_tokens=6, eos_token_ids=[])
        out = generate(*args, policy, len(prompts), max_new_tokens=6, eos_token_ids=[])
        assert out.token_ids == full.token_ids, policy


def test_kv_size_keeps_the_most_whole_chunks_its_pairs_hold():
    """At kv_size or kv_ratio the kept chunks are the most whose pairs fit the budget, the newest (partial) chunk
    at its own length, and at least the newest: (k - 1) c + newest <= budget."""
    for n in (20, 37, 45, 60, 61, 199):
        newest = n - (-(-n // 20) - 1) * 20
        for k in range(1, n + 3):
            got = int(budgets.layer_budgets(ChunkKV(kv_size=k), [n], 1)[0, 0])
            if k >= n:
                assert got == k, (n, k)
                continue
            fits = [(j - 1) * 20 + newest for j in range(1, -(-n // 20) + 1) if (j - 1) * 20 + newest <= k]
            assert got == max(fits, default=newest), (n, k)


@pytest.mark.parametrize("keys", [{"schedule": "decode_only"}, {"schedule": "prefill_and_decode"},
                                  {"head_budget": "adaptive"}, {"inner": "full"}, {"inner": "pyramidkv"},
                                  {"inner": "nope"}, {"inner_args": {"nope": 1}}, {"chunk_length": 0}])
def test_refusals_name_their_key(keys):
    with pytest.raises(ConfigError) as e:
        ChunkKV(**keys)
    assert e.value.key == f"policy.{next(iter(keys))}"


def test_a_chunk_holding_window_pairs_ranks_as_kvpresss():
    """kvpress's SnapKVPress scores its window the layer's largest score + 1 (`F.pad(..., value=scores.max().item()
    + 1)`), so under ChunkKVPress a chunk holding some window pairs outranks an older chunk of high scores. Chunks of
    4 over 12 pairs, the newest 6 protected (a stub inner scorer): pairs 0-3 score 0.9, 4-5 0.1, the window 0.
    kvpress keeps int(3 x (1 - 0.25)) = 2 chunks: 8-11 and 4-7, whose mean is (0.1 + 0.1 + 1.9 + 1.9) / 4 = 1.0 > 0.9
    (with the window at the largest score alone it would be 0.5 and chunk 0-3 kept instead)."""

    class Inner:  # protects its newest 6 pairs, as SnapKV its window
        protect_first, protect_recent = 0, 6

        def score(self, stats):
            return torch.tensor([0.9] * 4 + [0.1] * 2 + [0.0] * 6).view(1, 1, 1, 12)  # (L, B, H, N)

    policy = ChunkKV(compression_ratio=0.25, chunk_length=4)
    policy._inner = Inner()
    stats = SimpleNamespace(pos=torch.arange(12).view(1, 1, 1, 12), last=torch.full((1, 1, 1, 1), 11),
                            n=torch.full((1, 1, 1, 1), 12))
    chunk = policy.score(stats)[0, 0, 0, ::4]  # each chunk's score: 0-3, 4-7, 8-11 (the newest: always kept)
    assert chunk[:2].tolist() == pytest.approx([0.9, 1.0]) and chunk[2] == float("inf")


def test_any_registered_scorer_ranks_the_chunks():
    assert ChunkKV(inner="knorm").needs == ChunkKV(inner="knorm")._inner.needs
    assert ChunkKV(inner_args={"window": 32}).window == 32  # the inner's knobs read through



def test_over_expected_attention_keeps_the_rules_chunks_at_batch_4(tiny_llama):
    """The inner policy's observe step runs (ExpectedAttention's query statistics): the chunks of
    tests/reference_select.py's ChunkKV rule over tests/reference_methods.py's ExpectedAttention (both proven
    against kvpress 0.5.5), the newest chunk kept (kvbench's recorded departure), and their tokens."""
    from kvbench.engine import generate
    from tests import reference_generate as G
    from tests import reference_select as S
    from tests.policies.test_scored import NEW, _ref_model

    policy = ChunkKV(compression_ratio=0.5, inner="expected_attention")
    kept = []

    def observer(event, cache):
        if event == "evict":
            kept.append([[[[p for p in h if p >= 0] for h in cache.kept_positions(la, b).tolist()]
                          for la in range(cache.num_layers)] for b in range(len(PROMPTS))])

    def newest_first(scores):  # the newest chunk (maybe partial) ranks first; shorter than a chunk: the inner's
        n = len(scores[0])
        if n < 20:
            return scores
        return [[float("inf") if i >= (n - 1) // 20 * 20 else v for i, v in enumerate(s)] for s in scores]

    out = generate(tiny_llama.model, tiny_llama.tokenizer, PROMPTS, policy, len(PROMPTS), max_new_tokens=NEW,
                   eos_token_ids=[], observer=observer)
    for b, p in enumerate(PROMPTS):
        ctx = G.prefill(_ref_model("llama"), p)
        want = G.per_layer(ctx, lambda la: G._ea(ctx, la), lambda s: S.chunkkv(newest_first(s), 0.5, 20))  # noqa: B023
        tokens, _ = G.generate(_ref_model("llama"), p, NEW, None, keep=want)
        assert kept[0][b] == want and out.token_ids[b] == tokens, b

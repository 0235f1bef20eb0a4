"""ChunkKV over SnapKV against the brute-force rule (tests/reference.py's "chunkkv"): kept pairs and tokens of a
left-padded batch under after_prefill with chunks of 8; its budget in whole chunks (kvpress's count), what it
refuses, and that the inner policy is any registered one."""

from __future__ import annotations

import pytest

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


@pytest.mark.parametrize("keys", [{"schedule": "decode_only"}, {"schedule": "prefill_and_decode"},
                                  {"head_budget": "adaptive"}, {"inner": "full"}, {"inner": "pyramidkv"},
                                  {"inner": "nope"}, {"inner_args": {"nope": 1}}, {"chunk_length": 0}])
def test_refusals_name_their_key(keys):
    with pytest.raises(ConfigError) as e:
        ChunkKV(**keys)
    assert e.value.key == f"policy.{next(iter(keys))}"


def test_any_registered_scorer_ranks_the_chunks():
    assert ChunkKV(inner="knorm").needs == ChunkKV(inner="knorm")._inner.needs
    assert ChunkKV(inner_args={"window": 32}).window == 32  # the inner's knobs read through

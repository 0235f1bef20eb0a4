"""Block scores come from the policies' own score(): window drops the oldest block, h2o the least
attended one, batch_max / norm_sum divide by age; the start and recent areas are never candidates."""

from __future__ import annotations

import torch

from kvbench.policies import H2O, BatchMax, Full, Window
from kvbench.policies.policy import ScoreContext
from kvbench.serve.block_evict import BlockRule, block_scores, choose_blocks


def stats(sum_w: list[float], L=2, H=2):
    N = len(sum_w)
    pos = torch.arange(N)[None, None, None, :].expand(L, 1, H, N)
    w = torch.tensor(sum_w, dtype=torch.float32)[None, None, None, :].expand(L, 1, H, N)
    return ScoreContext(pos=pos, last=torch.full((1, 1, 1, 1), N - 1), sum_w=w, last_w=w)


def test_window_drops_the_oldest_evictable_block():
    s = block_scores(Window(kv_size=16, evict_every=4), stats([9.0] * 16), 4)
    assert choose_blocks(s, range(1, 3), 1) == [1]


def test_h2o_drops_the_least_attended_block():
    w = [1.0] * 4 + [5.0] * 4 + [0.1] * 4 + [3.0] * 4
    s = block_scores(H2O(kv_size=32, evict_every=1), stats(w), 4)
    assert choose_blocks(s, range(0, 4), 1) == [2]
    assert choose_blocks(s, range(0, 4), 2) == [0, 2]
    assert choose_blocks(s, range(0, 2), 1) == [0]  # only candidates


def test_age_normalisation_changes_the_choice():
    # block 0 is old with a large sum; block 2 is young with a smaller sum but a higher average
    w = [4.0] * 4 + [4.0] * 4 + [2.0] * 4 + [9.0] * 4
    h2o = block_scores(H2O(kv_size=32, evict_every=1), stats(w), 4)
    bm = block_scores(BatchMax(kv_size=32, evict_every=4), stats(w), 4)
    norm = block_scores(H2O(kv_size=32, evict_every=1), stats(w), 4, mode="norm_sum")
    assert choose_blocks(h2o, range(0, 3), 1) == [2]
    assert choose_blocks(bm, range(0, 3), 1) == [0]
    assert torch.allclose(norm, bm)  # NORM_SUM of H2O's sums is Batch-Max's average rule, per block


def test_rule_areas_and_full():
    rule = BlockRule.of(Window(kv_size=32, evict_every=8, protect_first=4), 8)
    assert rule.start_blocks == 1 and rule.recent == 0
    assert rule.evictable(30) == range(1, 3)  # block 3 is partly filled
    h = BlockRule.of(H2O(kv_size=32, evict_every=1), 8)
    assert h.recent == 16 and h.evictable(32) == range(0, 2) and not h.in_prefill
    from kvbench.serve.request import Request

    assert not BlockRule.of(Full(), 8).applies(Request(0, [1] * 10, 4, num_computed=100))


def test_a_recompute_stops_where_the_first_run_evicted():
    """BlockRule.span: a recomputed request's chunk never crosses the prompt's end (where after_prefill compresses and
    decode_only first evicts), nor, under the schedules that evict while decoding, the next decode step that evicted
    (the chunk evicts that step's blocks, then feeds what fits); after_prefill replays its output whole."""
    from kvbench.serve.request import Request

    def req(rule, prompt, output, computed, held):
        r = Request(0, [1] * prompt, 32, output=[2] * output, num_computed=computed)
        r.held, r.budget = torch.tensor([[held, held - 1]]), torch.tensor([[16, 16]])
        return rule.span(r)

    decode = BlockRule.of(H2O(kv_size=16, evict_every=1, schedule="decode_only"), 4)
    once = BlockRule.of(H2O(kv_size=16, evict_every=1, schedule="after_prefill"), 4)
    for rule in (decode, once):
        assert req(rule, 30, 10, 0, 0) == 30 and req(rule, 30, 10, 12, 12) == 18  # the prompt's end
    assert req(once, 30, 10, 30, 16) == 10  # compressed once, then the whole output
    # two heads holding (h, h - 1), budget 16, 4-slot blocks, H2O's 8 recent pairs; the first run fed one token a step
    assert req(decode, 30, 10, 30, 30) == 2  # head 0 evicts 4 blocks (30 -> 14), then 2 tokens reach 16
    assert req(decode, 30, 10, 33, 16) == 1  # head 0 evicts a block now, head 1 (15) before the token after
    assert req(decode, 30, 10, 34, 14) == 2  # nothing goes yet: head 0 (14) reaches 16 after 2 tokens
    assert req(decode, 30, 10, 39, 15) == 1  # the last output token
    assert BlockRule.of(Full(), 4).span(Request(0, [1] * 30, 32, output=[2] * 10)) == 40

"""Serve mode's attention cost follows the real work (issue 23): a forward's layout gives every prefill
chunk a part of its own, groups decode rows by the blocks they read with bounded padding, never pads a
decode row to a chunk's width, and lets a first chunk attend to its own new keys without a gather."""

from __future__ import annotations

import torch

from kvbench.serve.page_layout import DECODE_PAD, Layout


def layout(n_before, k, bs=4):
    tables, held, nxt = [], [], 0
    for nb, kk in zip(n_before, k, strict=True):
        need = -(-(nb + kk) // bs)
        tables.append(torch.arange(nxt, nxt + need)[None, None])  # (1, 1, W): one layer, one KV head
        held.append(torch.tensor([[nb]]))
        nxt += need
    return Layout.build(bs, tables, held, k, n_before, "cpu")


def test_parts_hold_only_real_queries():
    n_before = [0, 16, 5, 50, 60, 7, 300]
    k = [40, 8, 1, 1, 1, 1, 1]
    lay = layout(n_before, k)
    assert sum(p.q_index.numel() for p in lay.parts) == sum(k)  # no decode row padded to a chunk's width
    first = [p for p in lay.parts if p.fresh is not None]
    assert len(first) == 1 and first[0].fresh == slice(0, 40) and first[0].causal  # its own keys, no gather
    chunks = [p for p in lay.parts if p.q_index.shape[1] > 1]
    assert len(chunks) == 2 and all(p.rows == 1 for p in chunks)
    assert sorted(i for p in lay.parts for i in p.out.tolist()) == list(range(sum(k)))  # every query once


def test_decode_groups_bound_their_padding():
    n_before = [3, 5, 8, 40, 44, 47, 300, 301]
    lay = layout(n_before, [1] * 8)
    for p in lay.parts:
        valid = p.slots(0)[1]
        real = int(valid.sum())
        padded = valid.numel()
        blocks = p.blocks.numel()
        need = int(sum(-(-int(n) // 4) for n in p.n_after.flatten()))
        assert blocks <= (1 + DECODE_PAD) * need, (blocks, need)  # padded key work within the bound
        assert padded >= real
    long = next(p for p in lay.parts if 6 in p.out.tolist())
    assert sorted(long.out.tolist()) == [6, 7]  # the long rows apart from the short and middle ones
    whole = sum(p.slots(0)[1].numel() for p in lay.parts)
    assert whole < 8 * 4 * (-(-302 // 4)) / 2  # far less than padding every row to the longest

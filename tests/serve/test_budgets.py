"""Every policy, schedule and budget kind in serve mode, against the static engine (tiny models, float64).

schedule=after_prefill compresses each request once, when its prefill ends, each (layer, KV head) to its own
budget by the policy's score; with one-slot pages (block_size=1) serve keeps exactly the pairs the static
engine keeps, so the greedy tokens are the same, request by request, whatever the continuous batching and
chunked prefill did around them. That covers the newly served policies (SnapKV and PyramidKV with their
query windows), budget kinds (kv_ratio and compression_ratio: each request's own from its own prompt;
PyramidKV's per-layer budgets) and the schedule. The evicting schedules (prefill_and_decode, decode_only) run
on their own rules (whole blocks, the fewest that keep a request within budget) and are checked for their
invariants: never over any (layer, KV head)'s budget, every request finished.
"""

from __future__ import annotations

import pytest
import torch

from kvbench import engine
from kvbench.policies import H2O, TOVA, BatchMax, KeyDiff, Knorm, PyramidKV, SnapKV, StreamingLLM, Window
from kvbench.serve.blocks import blocks_for
from kvbench.serve.engine import serve
from kvbench.serve.request import Request
from tests.conftest import random_prompts

LENGTHS = (37, 12, 30)
ONCE = dict(schedule="after_prefill", evict_every=1)
PARITY = {
    "h2o": H2O(kv_size=10, **ONCE),
    "tova": TOVA(kv_size=10, **ONCE),
    "batch_max": BatchMax(kv_size=10, **ONCE),
    "knorm": Knorm(kv_size=10, **ONCE),
    "keydiff": KeyDiff(kv_size=10, **ONCE),
    "window": Window(kv_size=10, protect_first=2, **ONCE),
    "streaming_llm": StreamingLLM(kv_size=10, **ONCE),
    "snapkv": SnapKV(kv_size=10, window=4, **ONCE),
    "snapkv-kv_ratio": SnapKV(kv_ratio=0.5, window=4, **ONCE),
    "h2o-compression_ratio": H2O(compression_ratio=0.6, **ONCE),
    "pyramidkv-per_layer": PyramidKV(kv_size=12, window=4, beta=2, **ONCE),  # beta 2: layers' budgets differ
    "pyramidkv-compression_ratio": PyramidKV(compression_ratio=0.5, window=4, beta=2, **ONCE),
}


def requests(prompts, new):
    return [Request(rid=i, prompt=list(p), max_new_tokens=new) for i, p in enumerate(prompts)]


BOTH = ("snapkv", "pyramidkv-per_layer", "h2o-compression_ratio")  # also on tiny Phi-3 (no GQA)


def parity(lm, policy):
    prompts = random_prompts(LENGTHS, seed=11)
    want = engine.generate(lm.model, lm.tokenizer, prompts, policy, batch_size=1, max_new_tokens=6,
                           eos_token_ids=[]).token_ids
    reqs = requests(prompts, 6)
    out = serve(lm.model, reqs, policy, num_blocks=300, block_size=1, max_tokens_per_step=16)
    assert out.evicted_blocks > 0 and out.per_head
    assert [r.output for r in reqs] == want


@pytest.mark.parametrize("name", list(PARITY))
def test_after_prefill_matches_the_static_engine(tiny_llama, name):
    parity(tiny_llama, PARITY[name])


@pytest.mark.parametrize("name", BOTH)
def test_after_prefill_matches_the_static_engine_without_gqa(tiny_phi3, name):
    parity(tiny_phi3, PARITY[name])


@pytest.mark.parametrize("policy", [SnapKV(kv_size=16, window=4, evict_every=4, schedule="prefill_and_decode"),
                                    SnapKV(kv_ratio=0.6, window=4, evict_every=4),
                                    PyramidKV(kv_size=16, window=4, beta=2, evict_every=4),
                                    H2O(compression_ratio=0.5, evict_every=1, schedule="prefill_and_decode")],
                         ids=lambda p: f"{p.name}-{p.schedule}-{p.per_prompt or 'kv_size'}")
def test_evicting_schedules_keep_every_head_within_its_budget(tiny, policy, monkeypatch):
    from kvbench.serve import model_runner

    prompts = random_prompts(LENGTHS, seed=12)
    reqs = requests(prompts, 6)
    step = model_runner.ModelRunner.step
    over = []

    def checked(self, scheduled):
        for s in scheduled:
            r = s.req
            if s.req.budget is not None and (r.num_computed >= len(r.prompt) or policy.evicts_in_prefill):
                over.append(bool((r.held + s.num_tokens > r.budget).any()))
        return step(self, scheduled)

    monkeypatch.setattr(model_runner.ModelRunner, "step", checked)
    out = serve(tiny.model, reqs, policy, num_blocks=200, block_size=2, max_tokens_per_step=12)
    assert out.evicted_blocks > 0 and over and not any(over)
    assert all(r.finished and len(r.output) == 6 for r in reqs)


def test_per_prompt_budgets_follow_each_prompt(tiny_llama):
    policy = H2O(kv_ratio=0.5, evict_every=1, schedule="prefill_and_decode")
    reqs = requests(random_prompts((40, 24), seed=13), 4)
    serve(tiny_llama.model, reqs, policy, num_blocks=100, block_size=2, max_tokens_per_step=16)
    assert [int(r.budget.max()) for r in reqs] == [20, 12]


def test_per_layer_budgets_differ_by_layer(tiny_llama, monkeypatch):
    from kvbench.serve import model_runner

    policy = PyramidKV(kv_size=12, window=4, beta=2, evict_every=1, schedule="after_prefill")
    (r,) = requests(random_prompts((40,), seed=14), 3)
    step, held = model_runner.ModelRunner.step, []
    monkeypatch.setattr(model_runner.ModelRunner, "step", lambda self, s: held.append(r.held.clone()) or step(self, s))
    serve(tiny_llama.model, [r], policy, num_blocks=100, block_size=1, max_tokens_per_step=16)
    per_layer = r.budget[:, 0]
    assert len(set(per_layer.tolist())) > 1 and bool((r.budget == per_layer[:, None]).all())
    assert torch.equal(held[-1][:, 0] - 1, per_layer)  # compressed to each layer's own, then 1 token kept


def test_adaptive_head_budgets_keep_adakvs_pairs_and_free_pages_per_head(tiny_llama, monkeypatch):
    """policy.head_budget=adaptive: at the one compression each layer keeps H x budget pairs, each head its best by
    score with a floor of int(budget x head_floor): checked against a loop over heads written here (Random's
    scores are a hash of (layer, head, position), recomputed here from positions alone), and the pool's free
    pages are exactly what the heads' own counts leave."""
    from kvbench.policies import Random
    from kvbench.policies.policy import ScoreContext
    from kvbench.serve import model_runner

    b, bs, P = 12, 1, 40  # one-slot pages: each head keeps exactly its pairs
    policy = Random(kv_size=b, schedule="after_prefill", evict_every=1, head_budget="adaptive", head_floor=0.25)
    (r,) = requests(random_prompts((P,), seed=15), 3)
    step, seen = model_runner.ModelRunner.step, []

    def spy(self, scheduled):
        if r.num_computed == P:  # the first decode step: just compressed
            slots, valid = self.pool.slots(r.pages, r.held)
            seen.append((r.held.clone(), self.pool.pos[slots], valid, self.pool.num_pages))
        return step(self, scheduled)

    monkeypatch.setattr(model_runner.ModelRunner, "step", spy)
    from kvbench.serve import blocks

    free = []
    grow = blocks.BlockManager.grow
    monkeypatch.setattr(blocks.BlockManager, "grow", lambda bm, q, k: free.append(bm.num_free) or grow(bm, q, k))
    out = serve(tiny_llama.model, [r], policy, num_blocks=40, block_size=bs, max_tokens_per_step=64)
    held, pos, valid, pages = seen[0]
    L, H = held.shape
    score = policy.score(ScoreContext(pos=torch.arange(P).expand(L, 1, H, P), last=torch.full((1, 1, 1, 1), P - 1),
                                    layers=torch.arange(L)[:, None, None, None]))[:, 0]  # (L, H, P)
    floor = int(b * 0.25)
    for layer in range(L):
        safe = {(h, int(p)) for h in range(H) for p in score[layer, h].argsort(descending=True)[:floor]}
        rest = sorted(((float(score[layer, h, p]), h, p) for h in range(H) for p in range(P) if (h, p) not in safe),
                      reverse=True)
        want = safe | {(h, p) for _, h, p in rest[: H * b - len(safe)]}
        for h in range(H):
            kept = set(pos[layer, h][valid[layer, h]].tolist())
            assert kept == {p for hh, p in want if hh == h} and int(held[layer, h]) == len(kept)
    assert out.per_head and len({tuple(x) for x in held.view(-1, 1).tolist()}) > 1  # heads hold different counts
    # the free-page count after compression: every head's own pages gone, not the largest head's
    assert free[-1] == pages - int(blocks_for(held + 1, bs).sum())

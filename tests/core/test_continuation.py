"""kvbench.continuation (lm-eval's log-likelihoods) against the brute-force reference of tests/reference.py, which
shares no code with the engine.

The reference processes the context less its last token under the schedule (Algorithm 1's blocks, or the whole
prompt), evicts as a generation's first decode step would (after_prefill: down to the budget; otherwise, when
the cache is full, down to the budget less p), then reads the context's last token and the continuation one
token at a time, evicting nothing more, summing the continuation's log-probabilities. Every registered policy
with one budget for all layers, under each schedule it takes, at batch 1 and in a left-padded batch of 3, with
continuations longer than the room its budget leaves (and a context shorter than the budget, which keeps it
whole): the scores must be the reference's to 1e-9 in float64, and the greedy flags the same.
"""

from __future__ import annotations

import functools

import pytest
import torch

from kvbench import budgets as B
from kvbench.continuation import continuation_logprobs
from kvbench.errors import ConfigError
from kvbench.policies import registry
from tests import reference as R
from tests.conftest import random_prompts
from tests.policies.test_scored import _ref_model, spec_of

CONTEXTS = random_prompts((70, 24, 45), seed=11)  # budgets of 32 pairs: two evict, one is kept whole
CONTINUATIONS = random_prompts((30, 40, 9), seed=12)  # 30 and 40: longer than the room 32 pairs leave
SCHEDULES = ("prefill_and_decode", "decode_only", "after_prefill")


def policy_at(name: str, schedule: str):
    """The registered policy at its own config's values, budget 32 and p 8 (as tests/policies), under `schedule`
    where the policy takes one (None where it fixes its own)."""
    from hydra.utils import get_class, instantiate

    from kvbench.conf import load_option

    node = load_option("policy", name)
    if node.kv_size is not None and node.kv_size > 2:
        node.kv_size, node.evict_every = 32, 8
    if "window" in node:
        node.window = 8
    if "schedule" in getattr(get_class(node._target_), "inert_keys", ()):
        return None if schedule != node.schedule else instantiate(node, _convert_="all")
    node.schedule = schedule
    return instantiate(node, _convert_="all")


@functools.cache
def reference_score(context: tuple[int, ...], continuation: tuple[int, ...], spec: R.Spec) -> tuple[float, bool]:
    """(log P(continuation | context), every token the argmax) by the reference (module docstring)."""
    ref = _ref_model("llama")
    cache, history = ref.new_cache(), ref.new_history()
    prompt, s, kv, p = list(context[:-1]), len(context) - 1, spec.kv_size, spec.evict_every
    size = lambda: len(cache[0][0])  # noqa: E731  every head holds the same count

    def process(tokens: list[int], start: int) -> None:
        for i, tok in enumerate(tokens):
            ref.step(tok, start + i, cache, history)

    if spec.schedule == "prefill_and_decode":  # Algorithm 1: a first block of min(s, kv), then evict p, process p
        t1 = min(s, kv)
        process(prompt[:t1], 0)
        while t1 < s:
            R.evict(cache, spec, size() - p, t1 - 1, ref, history)
            t0, t1 = t1, min(s, t1 + p)
            process(prompt[t0:t1], t0)
    else:
        process(prompt, 0)
    if spec.schedule == "after_prefill" and size() > kv:  # the first decode step's eviction, the only one
        R.evict(cache, spec, kv, s - 1, ref, history)
    elif spec.schedule != "after_prefill" and size() >= kv:
        R.evict(cache, spec, kv - p, s - 1, ref, history)
    total, greedy = 0.0, True
    for i, (tok, target) in enumerate(zip([context[-1], *continuation[:-1]], continuation, strict=True)):
        lp = torch.log_softmax(ref.step(tok, s + i, cache, history).double(), -1)  # (V,)
        total += float(lp[target])
        greedy &= int(lp.argmax()) == target
    return total, greedy


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("name", sorted(n for n in registry() if n != "full"))
def test_continuation_matches_the_reference(name, schedule, tiny_llama):
    from hydra.errors import InstantiationException

    try:
        policy = policy_at(name, schedule)
    except InstantiationException:  # a schedule the policy refuses (tests/project/test_config_matrix.py checks it)
        pytest.skip(f"{name} refuses schedule {schedule}")
    if policy is None:
        pytest.skip(f"{name} fixes its own schedule")
    if policy.no_loglikelihood:  # refused in one line (test_a_policy_the_path_cannot_run_is_refused)
        with pytest.raises(ConfigError, match=f"{name} does not run on log-likelihood requests"):
            continuation_logprobs(tiny_llama.model, [[1, 2, 3]], [1], policy)
        return
    if B.layer_rule(policy).varies:
        pytest.skip("budgets that differ by layer: tests/core/test_lmeval.py runs it through lm-eval")
    spec = spec_of(policy)
    ids = [c + x for c, x in zip(CONTEXTS, CONTINUATIONS, strict=True)]
    n_cont = [len(x) for x in CONTINUATIONS]
    want = [reference_score(tuple(c), tuple(x), spec) for c, x in zip(CONTEXTS, CONTINUATIONS, strict=True)]
    for batch_size in (1, 3):
        got = continuation_logprobs(tiny_llama.model, ids, n_cont, policy, batch_size, tokenizer=tiny_llama.tokenizer)
        for b, ((lp, greedy), (ref_lp, ref_greedy)) in enumerate(zip(got, want, strict=True)):
            assert abs(lp - ref_lp) < 1e-9, (name, schedule, batch_size, b, lp, ref_lp)
            assert greedy == ref_greedy, (name, schedule, batch_size, b)


def test_the_reference_discriminates(tiny_llama):
    """The comparison can fail: with eviction the reference's scores differ from the full cache's for the
    contexts over the budget, equal them for the one within it, and differ between rules and schedules."""
    pairs = [(tuple(c), tuple(x)) for c, x in zip(CONTEXTS, CONTINUATIONS, strict=True)]
    full = [reference_score(c, x, R.Spec("newest", 10**6, 1, "decode_only")) for c, x in pairs]
    with torch.no_grad():  # the full cache's reference is a plain forward of the model
        for (c, x), (lp, _) in zip(pairs, full, strict=True):
            logits = tiny_llama.model(torch.tensor([list(c + x)])).logits[0, len(c) - 1:-1].double()
            assert abs(float(torch.log_softmax(logits, -1).gather(1, torch.tensor(x)[:, None]).sum()) - lp) < 1e-9
    scores = {}
    for rule, schedule in (("sum", "decode_only"), ("sum", "prefill_and_decode"), ("newest", "decode_only"),
                           ("sum", "after_prefill")):
        spec = R.Spec(rule, 32, 8, schedule, protect_recent=4)
        scores[rule, schedule] = [reference_score(c, x, spec)[0] for c, x in pairs]
        assert scores[rule, schedule][0] != full[0][0] and scores[rule, schedule][2] != full[2][0]
        assert scores[rule, schedule][1] == full[1][0]  # 24 + 40 tokens, a budget of 32: the context kept whole
    assert len({tuple(v) for v in scores.values()}) == len(scores)

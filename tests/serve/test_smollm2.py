"""Serving mode on the real default model (SmolLM2-135M-Instruct, float32, CPU); slow tests.

With `full`, all requests at time 0 and a pool large enough that nothing is preempted, every
request's greedy tokens equal the static engine's (batch size 1); with a pool that forces
preemptions, recompute gives the same tokens again.
"""

from __future__ import annotations

import pytest

from kvbench.engine import generate
from kvbench.policies import Full
from kvbench.serve.engine import serve
from kvbench.serve.request import Request
from tests.engine.test_smollm2 import lm, text_prompts  # noqa: F401 (the module-scoped model fixture)

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("num_blocks,preempts", [(64, False), (12, True)])
def test_serve_full_matches_static_engine(lm, num_blocks, preempts):  # noqa: F811
    prompts = [p[: 60 + 13 * i] for i, p in enumerate(text_prompts(lm.tokenizer, 4, 120))]
    new = 16
    want = generate(lm.model, lm.tokenizer, prompts, Full(), 1, max_new_tokens=new, ignore_eos=True).token_ids
    reqs = [Request(rid=i, prompt=p, max_new_tokens=new) for i, p in enumerate(prompts)]
    out = serve(lm.model, reqs, Full(), num_blocks=num_blocks, block_size=16, max_tokens_per_step=64)
    assert (out.preemptions > 0) == preempts
    assert [r.output for r in reqs] == want

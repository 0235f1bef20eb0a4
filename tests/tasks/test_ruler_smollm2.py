"""RULER's generation length on the default model (slow: SmolLM2-135M on the CPU; `make test-slow`).

niah_single_3's UUID answers take 35 to 39 of SmolLM2's tokens: with the task's own length (RULER's 128, what a
run generates when gen.max_new_tokens is null) the full cache scores at 1k tokens what 48 new tokens score, and a
32-token cap (kvbench's former default) cuts the answers. The noise haystack: no data set is needed.
"""

from __future__ import annotations

import pytest

from kvbench.engine import generate
from kvbench.policies import Full
from kvbench.tasks import TASKS
from tests.conftest import load_smollm2

pytestmark = pytest.mark.slow


def test_niah_single_3_scores_with_rulers_length_what_48_tokens_score():
    lm = load_smollm2()
    task = TASKS["niah_single_3"](n_samples=4, context_length=1024, haystack="noise")
    samples = task.samples(lm.tokenizer)
    ids = [task.encode(lm.tokenizer, s.prompt) for s in samples]

    def score(new_tokens: int) -> float:
        out = generate(lm.model, lm.tokenizer, ids, Full(), 4, max_new_tokens=new_tokens)
        texts = [task.cut_at_stop(lm.tokenizer.decode(t, skip_special_tokens=True)) for t in out.token_ids]
        return sum(task.score(task.extract(t), s.references)["string_match_all"]
                   for t, s in zip(texts, samples, strict=True)) / len(samples)

    own = score(task.default_new_tokens({}))
    assert task.default_new_tokens({}) == 128 and own == score(48) == 1.0
    assert score(32) < own

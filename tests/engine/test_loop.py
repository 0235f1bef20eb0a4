"""With the full cache, kvbench's engine must equal `model.generate` token for token."""

import pytest
import torch

from kvbench.engine import generate
from kvbench.policies import Full
from tests.conftest import SMOLLM2_TEXTS, hf_greedy, load_smollm2, random_prompts


@pytest.mark.parametrize("batch_size", [1, 4])
def test_full_cache_matches_generate(tiny, prompts4, batch_size):
    ref = [hf_greedy(tiny.model, p, 20) for p in prompts4]
    out = generate(tiny.model, tiny.tokenizer, prompts4, Full(), batch_size, max_new_tokens=20, eos_token_ids=[])
    assert out.token_ids == ref
    assert len(set(map(tuple, ref))) == 4  # the references differ: the comparison can fail


@pytest.mark.parametrize("chunk", [1, 7, 16])
def test_chunked_prefill_matches_generate(tiny_llama, prompts4, chunk):
    ref = [hf_greedy(tiny_llama.model, p, 12) for p in prompts4]
    out = generate(
        tiny_llama.model, tiny_llama.tokenizer, prompts4, Full(), 4, max_new_tokens=12, eos_token_ids=[], prefill_chunk=chunk
    )
    assert out.token_ids == ref


def test_left_padded_batch_matches_hf_batched_generate(tiny_phi3, prompts4):
    m = tiny_phi3.model
    L = max(map(len, prompts4))
    ids = torch.tensor([[258] * (L - len(p)) + p for p in prompts4])
    mask = (ids != 258).long()
    for b, p in enumerate(prompts4):
        mask[b, : L - len(p)] = 0
        mask[b, L - len(p) :] = 1
    hf = m.generate(ids, attention_mask=mask, max_new_tokens=15, do_sample=False, eos_token_id=None, pad_token_id=258)
    out = generate(m, tiny_phi3.tokenizer, prompts4, Full(), 4, max_new_tokens=15, eos_token_ids=[])
    assert out.token_ids == hf[:, L:].tolist()


def test_eos_stops_like_generate(tiny_llama):
    """Pick an EOS id the model actually emits, then compare the cut sequences."""
    prompts = random_prompts((30, 18, 44, 9), seed=5)
    free = [hf_greedy(tiny_llama.model, p, 25) for p in prompts]
    eos = free[0][6]  # sample 0 stops at step 6; others stop whenever they meet this id (or not at all)
    ref = []
    for p in prompts:
        r = hf_greedy(tiny_llama.model, p, 25, eos=eos)
        ref.append(r[: r.index(eos) + 1] if eos in r else r)
    out = generate(tiny_llama.model, tiny_llama.tokenizer, prompts, Full(), 4, max_new_tokens=25, eos_token_ids=[eos])
    assert out.token_ids == ref
    assert out.token_ids[0][-1] == eos and len(out.token_ids[0]) == 7
    ignored = generate(
        tiny_llama.model, tiny_llama.tokenizer, prompts, Full(), 4, max_new_tokens=25, eos_token_ids=[eos], ignore_eos=True
    )
    assert ignored.token_ids == free and ignored.generated_tokens == 4 * 25


def test_attention_restored_after_generation(tiny_llama, prompts4):
    before = tiny_llama.model.config._attn_implementation
    generate(tiny_llama.model, tiny_llama.tokenizer, prompts4[:1], Full(), 1, max_new_tokens=2, eos_token_ids=[])
    assert tiny_llama.model.config._attn_implementation == before


@pytest.mark.slow
@pytest.mark.parametrize("batch_size", [1, 4])
def test_smollm2_full_cache_matches_generate(batch_size):
    lm = load_smollm2()
    prompts = [lm.tokenizer(t)["input_ids"] for t in SMOLLM2_TEXTS]
    ref = [hf_greedy(lm.model, p, 24, pad=lm.pad_token_id) for p in prompts]
    out = generate(lm.model, lm.tokenizer, prompts, Full(), batch_size, max_new_tokens=24, eos_token_ids=[])
    assert out.token_ids == ref


def test_engine_uses_the_cache_argument_the_model_declares(tiny, prompts4):
    """transformers 5.24 renamed forward's `past_key_values` to `cache` (the old name warns, then goes in
    5.40): the engine, prefill chunks included, passes the name the installed transformers declares."""
    import inspect
    import warnings

    from kvbench.models.compat import cache_kwarg

    params = inspect.signature(type(tiny.model).forward).parameters
    assert cache_kwarg(tiny.model) in params and cache_kwarg(tiny.model.get_decoder()) in params
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        generate(tiny.model, tiny.tokenizer, prompts4, Full(), 4, max_new_tokens=3, eos_token_ids=[], prefill_chunk=5)
    assert not [w for w in seen if "past_key_values" in str(w.message)]

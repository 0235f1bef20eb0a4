"""The KV cache held during decode, measured from the allocation (mean and largest over decode steps): a
compressed prompt's memory given back shows there, not in the peak (kvbench.engine.loop, kvbench.serve.engine)."""

from kvbench.cache import KVCache
from kvbench.engine import generate
from kvbench.policies import BatchMax, Full
from kvbench.serve.engine import serve
from kvbench.serve.request import Request

NEW = 6


def run(lm, prompts, policy):
    return generate(lm.model, lm.tokenizer, prompts, policy, len(prompts), max_new_tokens=NEW, eos_token_ids=[])


def test_static_decode_kv_follows_the_allocation(tiny_llama, prompts4):
    cfg = tiny_llama.model.config
    full = run(tiny_llama, prompts4, Full())
    assert full.decode_steps == NEW - 1
    assert full.decode_kv_bytes_mean == full.decode_kv_bytes_peak == full.kv_allocated_bytes  # preallocated, whole
    kept = BatchMax(kv_size=8, evict_every=4, schedule="decode_only")
    out = run(tiny_llama, prompts4, kept)  # the prompt is compressed at the first decode step, then resized
    assert out.decode_kv_bytes_peak < out.kv_allocated_bytes < full.kv_allocated_bytes + 1
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    shape = dict(batch_size=len(prompts4), num_layers=cfg.num_hidden_layers, num_kv_heads=cfg.num_key_value_heads,
                 head_dim=head_dim, dtype=tiny_llama.model.dtype, track_attention=True,
                 num_q_heads=cfg.num_attention_heads)
    caps = [c for c in range(1, max(map(len, prompts4)) + NEW)
            if KVCache.nbytes_for(capacity=c, **shape) == out.decode_kv_bytes_peak]
    assert caps and 8 <= caps[0] < min(map(len, prompts4))  # the budget's slots (+ the next tokens'), not the prompt's


def test_serve_decode_kv_is_the_pages_in_use(tiny_llama, prompts4):
    def reqs():
        return [Request(rid=i, prompt=p, max_new_tokens=NEW) for i, p in enumerate(prompts4)]

    full = serve(tiny_llama.model, reqs(), Full(), num_blocks=64, block_size=4, max_tokens_per_step=64,
                 ignore_eos=True)
    kept = serve(tiny_llama.model, reqs(), BatchMax(kv_size=8, evict_every=4), num_blocks=64, block_size=4,
                 max_tokens_per_step=64, ignore_eos=True)
    for out in (full, kept):
        mean, peak = out.decode_kv_bytes
        assert 0 < mean <= peak <= out.peak_pages * out.block_bytes / out.pages_per_block
        assert len(out.decode_pages) < out.steps  # the prefill steps are not decode steps
    assert kept.decode_kv_bytes[1] < full.decode_kv_bytes[0]  # evicted pages are given back to the pool

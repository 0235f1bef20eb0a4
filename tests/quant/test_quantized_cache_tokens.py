"""The accuracy reference of a quantized cache: kvbench's full cache at 4 bits against transformers' own
`QuantizedCache` (quanto backend) on SmolLM2-135M, greedy, where the rule is the same: KIVI's axes (keys per channel
over G = 32 tokens, values per token over 32 channels, `axis_key=-1`, `axis_value=0`), prompts of whole blocks, a
window of 0 to G - 1 full-precision pairs (kvbench R = 0, transformers `residual_length=G`). The blocks' codes and
reads are the same (tests/quant/test_quanto_reference.py); the flows differ in two places, so the tokens may part:

- the forward that writes pairs: transformers attends the prompt (and, at a flush, the block it flushes) as it was
  computed and quantizes it for the next steps only; kvbench attends everything it holds through its store, the
  prompt's blocks read quantized in the prompt's own forward (so later layers' pairs already differ);
- at each flush transformers re-quantizes every block from its read (a rounding, <= 2e-6), kvbench leaves them.

Measured here (float32, CPU, 4 prompts, 32 new tokens): the common prefixes were 28, 2, 26 and 32 tokens; each
flow against the cache in float32: kvbench 28, 2, 32, 32, transformers 32, 5, 26, 32 (each parts from the float32
tokens about as often as from the other: a greedy near-tie moved by a 4-bit rounding, not a different rule). The
test asserts that 3 of the 4 prompts share their first 16 tokens with transformers' (a broken quantizer parts at
once) and that kvbench's int4 tokens are not all the float32 ones (a cache that quantized nothing would pass the
first). It does not tell KIVI's per-channel keys from transformers' default per-token keys (`axis_key=0` passed it
too: at 4 bits both stay near float32 here); the rules' codes are compared in tests/quant/test_quanto_reference.py.
Slow (the real model, about a minute of CPU); skipped without optimum-quanto (`pip install optimum-quanto`).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("optimum.quanto")

pytestmark = pytest.mark.slow

G, NEW = 32, 16
TEXTS = [
    "The history of the Roman Empire spans many centuries. It began when Augustus became the first emperor in 27 "
    "BC, and the western half lasted until 476 AD. During this time the empire",
    "Photosynthesis is the process by which green plants and some other organisms use sunlight to synthesize foods "
    "from carbon dioxide and water. The process generally involves the green pigment chlorophyll and",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if n < 2:\n        return n\n    return '
    'fibonacci(n - 1) + fibonacci(n - 2)\n\n\ndef factorial(n):\n    """Return n factorial."""\n',
    "Passkey: the secret number is 71432. Remember it. The grass is green. The sky is blue. The sun is yellow. Here "
    "we go. There and back again. What is the secret number? The secret number is",
]


def _common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))


def test_kvbench_int4_reads_as_transformers_quantized_cache():
    from transformers.cache_utils import QuantizedCache

    from kvbench.engine import generate
    from kvbench.policies import registry
    from kvbench.quant.qconfig import KVQuant
    from tests.conftest import load_smollm2

    lm = load_smollm2()
    model, tok = lm.model, lm.tokenizer
    prompts = [ids[: len(ids) // G * G] for ids in (tok(t)["input_ids"] for t in TEXTS)]  # whole blocks
    assert all(len(p) >= G for p in prompts)
    full = registry()["full"]()
    mine = generate(model, tok, prompts, full, 1, max_new_tokens=NEW, eos_token_ids=[], kv_quant=KVQuant(4, G, 0)).token_ids
    plain = generate(model, tok, prompts, full, 1, max_new_tokens=NEW, eos_token_ids=[]).token_ids

    def theirs(p):
        cache = QuantizedCache("quanto", model.config, nbits=4, axis_key=-1, axis_value=0, q_group_size=G,
                               residual_length=G)
        out = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                             max_new_tokens=NEW, do_sample=False, eos_token_id=None, pad_token_id=tok.pad_token_id or 0,
                             past_key_values=cache)
        return out[0, len(p):].tolist()

    shared = [_common_prefix(a, theirs(p)) for a, p in zip(mine, prompts, strict=True)]
    assert sum(s == NEW for s in shared) >= 3, shared
    assert mine != plain  # the cache really quantized (measured: the second prompt parts from float32 at token 3)

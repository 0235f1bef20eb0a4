"""Tiny random-weight Llama (GQA) and Phi-3 models with a byte-level tokenizer built in code.

For tests and smoke runs: nothing is downloaded. The tokenizer maps UTF-8 bytes to ids 0-255 and
has ChatML special tokens and a chat template, so chat-style prompts work like on real models.
"""

from __future__ import annotations

import torch

from kvbench.errors import ConfigError
from kvbench.models.base import LoadedModel, ModelSpec, finish, resolve_device, resolve_dtype

SPECIALS = ["<|im_start|>", "<|im_end|>", "<|pad|>"]
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_tokenizer():
    """A byte-level BPE tokenizer with no merges (ids 0-255 = bytes) + ChatML specials (256-258)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_chars = bytes_to_unicode()
    vocab = {byte_chars[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|pad|>"
    )
    fast.add_special_tokens({"additional_special_tokens": SPECIALS})
    fast.chat_template = CHATML
    fast.padding_side = "left"
    return fast


def tiny_config(arch: str, vocab_size: int = 288, layers: int = 2):
    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        max_position_embeddings=8192,
        initializer_range=0.2,  # peaked logits: greedy outputs vary, so parity tests can fail
        bos_token_id=256,
        eos_token_id=257,
        pad_token_id=258,
        tie_word_embeddings=False,
    )
    if arch == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(num_key_value_heads=2, **common)  # GQA: 2 query heads per KV head
    if arch == "phi3":
        from transformers import Phi3Config

        return Phi3Config(num_key_value_heads=4, **common)
    raise ConfigError("model.arch", "must be llama or phi3", arch)


def tokenizer(model_cfg):
    return byte_tokenizer()


def weights(model_cfg, dtype: str) -> str:
    return f"random initialisation (seed {model_cfg.get('seed', 0)}), {dtype}"


def build_tiny(
    name: str, arch: str = "llama", dtype: str = "float32", device: str = "auto", seed: int = 0, layers: int = 2
) -> LoadedModel:
    from transformers import AutoModelForCausalLM

    dev = resolve_device(device)
    cfg = tiny_config(arch, layers=layers)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg, dtype=resolve_dtype(dtype, dev))
    model.generation_config.eos_token_id = cfg.eos_token_id
    model.generation_config.pad_token_id = cfg.pad_token_id
    return finish(model.to(dev), byte_tokenizer(), name)


def tiny_spec(
    name: str, arch: str = "llama", dtype: str = "float32", device: str = "auto", seed: int = 0, layers: int = 2
) -> ModelSpec:
    """`build_tiny`'s model without its weights."""
    return ModelSpec(config=tiny_config(arch, layers=layers), dtype=resolve_dtype(dtype, torch.device(device)),
                     tokenizer=byte_tokenizer)

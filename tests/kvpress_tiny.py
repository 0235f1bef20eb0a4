"""The tiny model and tokenizer that kvpress's fixtures (tests/data/kvpress_methods/) were made on, rebuilt
identically in kvbench's venv and in kvpress's: plain torch and transformers, no kvbench import (the fixture
script, scripts/crosscheck/kvpress_fixtures.py, runs in kvpress's venv and imports this file).

The weights are drawn parameter by parameter, in name order, from one seeded torch generator (the same torch
on both sides), not by transformers' initialisation (which may change between its versions); `weights_sum`
is written in each fixture so that a test sees a different model at once. The tokenizer maps each character
to an id and has a one-line chat template, enough for KVzip's repeat prompts and DuoAttention's calibration.
"""

from __future__ import annotations

import torch

SEED = 0
CONFIG = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=8, max_position_embeddings=512, rms_norm_eps=1e-6,
              tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
SCALE = {"q_proj": 0.3, "k_proj": 0.3}  # other matrices 0.2; norms 1 + 0.1 N(0, 1)


def tiny_model(dtype=torch.float32):
    """A 2-layer Llama with grouped-query attention (4 query heads over 2 KV heads, head_dim 8), SDPA."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**CONFIG)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            x = torch.randn(p.shape, generator=g, dtype=torch.float32)
            kind = name.split(".")[-2]
            p.copy_(1 + 0.1 * x if "norm" in name else SCALE.get(kind, 0.2) * x)
    return model.to(dtype)


def weights_sum(model) -> float:
    return float(sum(p.detach().double().sum() for p in model.parameters()))


class Encoding(dict):
    """What a transformers tokenizer's call returns, as far as kvpress reads it."""

    def to(self, device):
        return self


class CharTokenizer:
    """Each character one id (3 + its code point modulo vocab - 3); chat template "<|u|>{user}<|a|>"."""

    chat_template = "<|u|>{user}<|a|>"

    def __init__(self, vocab: int = CONFIG["vocab_size"]):
        self.vocab = vocab

    def encode(self, text: str, return_tensors=None, add_special_tokens: bool = True):
        ids = [3 + ord(c) % (self.vocab - 3) for c in text]
        return torch.tensor([ids]) if return_tensors == "pt" else ids

    def __call__(self, text: str, return_tensors=None):
        return Encoding(input_ids=self.encode(text, return_tensors))

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=False, **kwargs):
        return self.chat_template.format(user=messages[0]["content"])


def prompt_ids(n: int = 40, seed: int = 1) -> list[int]:
    """The chat prefix's ids, then random ids: n in all."""
    prefix = CharTokenizer().encode("<|u|>")
    g = torch.Generator().manual_seed(seed)
    return prefix + torch.randint(3, CONFIG["vocab_size"], (n - len(prefix),), generator=g).tolist()


CALIBRATION = ["the cat sat on the mat", "a quick brown fox jumps", "over the lazy dog again"]


def kvzap_weights(kind: str = "mlp", hidden_dim: int = 4, seed: int = 2) -> tuple[dict, dict]:
    """A KVzap scorer for the tiny model in the Hub's layout (nvidia/KVzap-<kind>-<model>: config.json with
    input_dim, output_dim, hidden_dim (null: linear), n_modules; model.safetensors with one module per layer:
    `layers.{l}.weight/bias` (linear) or `layers.{l}.0.*` and `layers.{l}.2.*` (Linear, GELU, Linear))."""
    c = CONFIG
    cfg = dict(input_dim=c["hidden_size"], output_dim=c["num_key_value_heads"], n_modules=c["num_hidden_layers"],
               hidden_dim=hidden_dim if kind == "mlp" else None)
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for layer in range(cfg["n_modules"]):
        dims = [(hidden_dim, cfg["input_dim"]), (cfg["output_dim"], hidden_dim)] if kind == "mlp" else \
            [(cfg["output_dim"], cfg["input_dim"])]
        for j, (out, inp) in enumerate(dims):
            p = f"layers.{layer}." + (f"{2 * j}." if kind == "mlp" else "")
            sd[p + "weight"] = torch.randn(out, inp, generator=g) * 0.5
            sd[p + "bias"] = torch.randn(out, generator=g) * 0.1
    return cfg, sd

"""Tiny random-weight models of every family kvbench runs, with a byte-level tokenizer built in code.

For tests and smoke runs: nothing is downloaded. `llama` (GQA) and `phi3` are the models most tests use;
the other archs (`FAMILY_ARCHS`) are the family matrix's (tests/models/test_family.py): windows of 16-24
tokens, so prompts of 60-80 tokens cross them. The tokenizer maps UTF-8 bytes to ids 0-255 and
has ChatML special tokens and a chat template, so chat-style prompts work like on real models.
"""

from __future__ import annotations

import torch

from kvbench.errors import ConfigError
from kvbench.models import family
from kvbench.models.loaded import LoadedModel, ModelSpec, finish, resolve_device, resolve_dtype

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
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise ConfigError("model.layers", "must be an integer >= 1 (the tiny model's decoder layers)", layers)
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
    if arch in FAMILY_ARCHS:
        from transformers import AutoConfig

        model_type, extra = FAMILY_ARCHS[arch]
        return AutoConfig.for_model(model_type, **{**common, "num_key_value_heads": 2, **extra})
    raise ConfigError("model.arch", f"must be one of llama, phi3, {', '.join(FAMILY_ARCHS)}", arch)


# the family matrix's tiny models: arch -> (transformers model_type, config fields over the common ones)
FAMILY_ARCHS = {
    "llama3": ("llama", dict(rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0,
                                                  low_freq_factor=1.0, high_freq_factor=4.0,
                                                  original_max_position_embeddings=32))),
    "mistral": ("mistral", dict(sliding_window=None)),
    "mistral-window": ("mistral", dict(sliding_window=16)),
    "qwen2": ("qwen2", dict(use_sliding_window=False)),
    "qwen2-window": ("qwen2", dict(use_sliding_window=True, sliding_window=20, max_window_layers=1)),
    "qwen3": ("qwen3", dict(head_dim=16)),
    "phi3-window": ("phi3", dict(sliding_window=24, original_max_position_embeddings=4096, rope_parameters=dict(
        rope_type="longrope", rope_theta=10000.0, partial_rotary_factor=0.5,
        short_factor=[1.0, 1.1, 1.2, 1.3], long_factor=[1.5, 2.0, 3.0, 4.0]))),
    "gemma2": ("gemma2", dict(head_dim=16, query_pre_attn_scalar=24, sliding_window=16, attn_logit_softcapping=5.0,
                              final_logit_softcapping=30.0)),
    "gemma3": ("gemma3_text", dict(head_dim=16, query_pre_attn_scalar=24, sliding_window=16,
                                   layer_types=["sliding_attention", "full_attention"])),
    "olmo2": ("olmo2", dict()),
    "granite": ("granite", dict(attention_multiplier=0.2, embedding_multiplier=2.0, residual_multiplier=0.5,
                                logits_scaling=2.0)),
    "cohere": ("cohere", dict(logit_scale=0.5, use_qk_norm=False)),
    "starcoder2": ("starcoder2", dict(sliding_window=20, use_bias=True)),
    "gpt-oss": ("gpt_oss", dict(head_dim=16, sliding_window=16, num_local_experts=4, num_experts_per_tok=2,
                                layer_types=["sliding_attention", "full_attention"], rope_parameters=dict(
                                    rope_type="yarn", rope_theta=150000.0, factor=2.0, beta_fast=32.0, beta_slow=1.0,
                                    original_max_position_embeddings=4096))),
    "mixtral": ("mixtral", dict(sliding_window=None, num_local_experts=4, num_experts_per_tok=2)),
    "qwen3-moe": ("qwen3_moe", dict(head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                    norm_topk_prob=True)),
    "glm4": ("glm4", dict(head_dim=16)),  # partial rotary 0.5 on interleaved pairs
    "glm4-moe": ("glm4_moe", dict(head_dim=16, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                  first_k_dense_replace=1, use_qk_norm=True)),  # layer 0 dense, layer 1 MoE
    "ministral": ("ministral", dict(head_dim=16, sliding_window=20, layer_types=["sliding_attention", "full_attention"])),
    # yarn and the llama-4 attention temperature on queries, from position 32 on
    "ministral3": ("ministral3", dict(head_dim=16, rope_parameters=dict(
        rope_type="yarn", rope_theta=1000000.0, factor=256.0, original_max_position_embeddings=32, beta_fast=32.0,
        beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0, llama_4_scaling_beta=0.1))),
    "olmo3": ("olmo3", dict(sliding_window=16, layer_types=["sliding_attention", "full_attention"])),
    "smollm3": ("smollm3", dict(no_rope_layers=[1, 0])),  # layer 1 has no RoPE
    "exaone4": ("exaone4", dict(sliding_window=16, layer_types=["sliding_attention", "full_attention"])),  # NoPE global
    # hybrid linear-attention models: a Gated-DeltaNet layer and a full-attention one
    "qwen3.5": ("qwen3_5_text", dict(head_dim=16, linear_key_head_dim=8, linear_value_head_dim=8,
                                      linear_num_key_heads=2, linear_num_value_heads=4,
                                      layer_types=["linear_attention", "full_attention"])),
    "qwen3.5-moe": ("qwen3_5_moe_text", dict(head_dim=16, linear_key_head_dim=8, linear_value_head_dim=8,
                                              linear_num_key_heads=2, linear_num_value_heads=4, num_experts=4,
                                              num_experts_per_tok=2, moe_intermediate_size=32,
                                              shared_expert_intermediate_size=32,
                                              layer_types=["linear_attention", "full_attention"])),
    "qwen3-next": ("qwen3_next", dict(head_dim=16, linear_key_head_dim=8, linear_value_head_dim=8,
                                      linear_num_key_heads=2, linear_num_value_heads=4, num_experts=4,
                                      num_experts_per_tok=2, moe_intermediate_size=32,
                                      shared_expert_intermediate_size=32,
                                      layer_types=["full_attention", "linear_attention"])),  # pads reach layer 1
    # Gemma 4: a sliding layer (2 KV heads x 16) and a global one (1 KV head x 32, K = V, partial RoPE)
    "gemma4": ("gemma4_text", dict(head_dim=16, global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True,
                                   sliding_window=16, layer_types=["sliding_attention", "full_attention"],
                                   hidden_size_per_layer_input=8, vocab_size_per_layer_input=288,
                                   final_logit_softcapping=30.0)),
    # a family kvbench refuses (tests/models/test_family.py checks the refusal): Gemma 3 with bidirectional attention
    "gemma3-bidirectional": ("gemma3_text", dict(head_dim=16, query_pre_attn_scalar=24, sliding_window=16,
                                                 use_bidirectional_attention=True)),
}


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
    family.check(cfg)  # a family kvbench cannot run exactly is refused before any weight is built
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

"""The positions a model takes, from its transformers config alone (no weights), and the runs that would pass them.

`max_positions(config)` is the longest sequence the config declares: the smallest of the length fields a config
may carry (`max_position_embeddings`, GPT-2's `n_positions`, ...; vLLM reads the same list), extended by a RoPE
scaling that states its factor over a shorter original length (linear, dynamic: the field x factor; yarn: its
`original_max_position_embeddings` x factor), never below the field itself: vLLM's rule for its `max_model_len`.
llama3 and longrope, and RoPE set per layer type (Gemma 3), already count the extended length in the field. None
(no field): any length, nothing is refused.

The preflight (`kvbench.config.preflight.check_run`) and `kvbench-plan` refuse, before any weight loads, a RULER
`task.context_length` past it (before its prompts are rendered: the key that sets them), a prompt past it
(`task.max_input_tokens` cuts prompts; `plan.prompt_tokens` where the plan is given its length), and a prompt +
`gen.max_new_tokens` past it; each in one line naming the key.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from kvbench.errors import ConfigError

LENGTH_FIELDS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length",
                 "max_seq_length", "seq_len")
SCALED = ("linear", "dynamic", "yarn")  # RoPE types whose factor extends the field (or yarn's original length)


def max_positions(config) -> int | None:
    """The longest sequence `config` (a transformers config) declares it takes; None when it states none."""
    from kvbench.models.family import text_config

    cfg = text_config(config)
    found = [v for k in LENGTH_FIELDS if isinstance(v := getattr(cfg, k, None), int) and v > 0]
    if not found:
        return None
    limit = min(found)
    p = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if not isinstance(p, dict) or any(isinstance(v, dict) for v in p.values()):
        return limit  # RoPE per layer type (Gemma 3): the field counts its scaling already
    kind, factor = p.get("rope_type") or p.get("type"), p.get("factor")
    if kind in SCALED and isinstance(factor, (int, float)) and factor > 1:
        base = (p.get("original_max_position_embeddings") or limit) if kind == "yarn" else limit
        limit = max(limit, int(base * factor))
    return limit


def _model(cfg: DictConfig, config) -> str:
    return (f"the {max_positions(config)} positions {cfg.model.get('name') or 'the model'} takes (its config's "
            "max_position_embeddings, with its RoPE scaling)")


def check_task_positions(cfg: DictConfig, config) -> None:
    """A RULER task's context_length (prompt + the tokens it generates) within the model's positions."""
    limit = None if config is None else max_positions(config)
    n = cfg.task.get("context_length")
    if limit is not None and isinstance(n, int) and n > limit:
        raise ConfigError("task.context_length", f"{n} tokens pass {_model(cfg, config)}", n)


def check_positions(cfg: DictConfig, config, lengths: list[int] | None, prompt_key: str = "task.max_input_tokens",
                    ) -> None:
    """Every prompt, and every prompt + gen.max_new_tokens, within the model's positions (lengths None: the new
    tokens alone)."""
    limit = None if config is None else max_positions(config)
    if limit is None:
        return
    new, longest = int(cfg.gen.max_new_tokens or 0), max(lengths or [0])
    if longest > limit:
        raise ConfigError(prompt_key, f"a prompt of {longest} tokens passes {_model(cfg, config)}",
                          OmegaConf.select(cfg, prompt_key))
    if longest + new > limit:
        raise ConfigError("gen.max_new_tokens", f"prompts of up to {longest} tokens + {new} new pass "
                          f"{_model(cfg, config)}", new)

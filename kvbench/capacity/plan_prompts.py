"""The prompt lengths a capacity plan is made for: the task's real ones, or `plan.prompt_tokens` for each.

The real lengths are the preflight's (`kvbench.config.preflight.prompt_lengths`: the task's samples rendered
with the model's tokenizer alone, cached per process), so the plan and a run's preflight count the same
tokens. The paper's models' tokenizers are on the Hub only: offline, the plan needs `plan.prompt_tokens`
(the worst case, every prompt that long), and a tokenizer or data that cannot be had names that key.
"""

from __future__ import annotations

from omegaconf import DictConfig

from kvbench.config import build_task, preflight
from kvbench.errors import ConfigError


def prompt_lengths(cfg: DictConfig) -> tuple[list[int], str]:
    """The task's prompt lengths in tokens, or plan.prompt_tokens for every sample; and where they came from."""
    task = build_task(cfg)
    if cfg.plan.prompt_tokens is not None:
        return [int(cfg.plan.prompt_tokens)] * max(1, task.n_samples or 1), "plan.prompt_tokens"
    try:
        lengths = preflight.prompt_lengths(cfg)
    except Exception as e:
        if isinstance(e, ConfigError) and e.key.startswith("task"):  # the task's own limits: its key says it
            raise
        cause = e.__context__ if isinstance(e, ConfigError) and e.__context__ is not None else e  # the loader's
        lengths, why = None, f"{type(cause).__name__}; offline?"
        if isinstance(e, ConfigError) and e.key == "model.pretrained":  # kvbench.models.hub.check: no retries
            why = "it is not in the local Hugging Face cache and the Hub cannot be reached"
    else:
        why = "no tokenizer for this loader"
    if lengths is None:
        raise ConfigError(
            "plan.prompt_tokens",
            f"the task's prompt lengths need {cfg.model.name}'s tokenizer and the data, and loading them failed"
            f" ({why}): give the longest prompt instead, e.g. plan.prompt_tokens=3584",
            None,
        ) from None
    return lengths, f"{task.name} prompts ({len(lengths)} samples)"

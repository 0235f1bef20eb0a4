"""The prompts' lengths in tokens, from the model's tokenizer alone (no weights): what every check and plan
that depends on prompt length reads before a model loads.

`prompt_token_lengths(task, tokenizer)` is the one computation: each sample's prompt as the task renders it
for this tokenizer (`task.samples`: its chat template where the task uses one), tokenized as the run
tokenizes it (`task.encode`), counted. The preflight
(`prompt_lengths(cfg)`, cached per model, task and data for the process: a sweep renders each task once) and
kvbench-plan (with its loader's weight-free tokenizer) both use it, so a plan and a run count alike. The same
rendering counts each prompt's question tokens (`prompt_tokens`, `question_lengths`: task.query_aware=false).
"""

from __future__ import annotations

import json

from omegaconf import DictConfig, OmegaConf

from kvbench.config.groups import build_task
from kvbench.errors import ConfigError

NOT_TOKENIZER = ("device", "dtype")  # model keys that do not change the tokenizer
_lengths: dict[str, tuple[list[int], list[int], list[int]]] = {}


def prompt_token_lengths(task, tokenizer) -> list[int]:
    """The token count of each prompt `task` gives the model (its samples, in order), rendered with
    `tokenizer`; ConfigError naming the first row that renders to an empty prompt (nothing to run), or a task
    limit that cannot be met (`task.samples`)."""
    return prompt_tokens(task, tokenizer)[0]


def prompt_tokens(task, tokenizer) -> tuple[list[int], list[int], list[int]]:
    """(each prompt's token count, each one's question tokens as the run counts them (`task.question_tokens`:
    0 unless task.query_aware=false), each one's row index), one rendering; ConfigError as
    `prompt_token_lengths`."""
    samples = task.samples(tokenizer)
    ids = [task.encode(tokenizer, s.prompt) for s in samples]
    lengths = [len(x) for x in ids]
    empty = [s.index for s, n in zip(samples, lengths, strict=True) if n == 0]
    if empty:
        raise ConfigError("task", f"row {empty[0]} renders to an empty prompt", task.name)
    questions = [0] * len(ids) if getattr(task, "query_aware", True) else [  # as kvbench.run.static counts them
        task.question_tokens(tokenizer, s, x) for s, x in zip(samples, ids, strict=True)]
    return lengths, questions, [s.index for s in samples]


def prompt_lengths(cfg: DictConfig) -> list[int] | None:
    """Token count of every prompt the run gives the model, rendered with its tokenizer alone (cached); None
    for a loader kvbench does not know (no tokenizer without the model)."""
    rendered = _rendered(cfg)
    return None if rendered is None else rendered[0]


def question_lengths(cfg: DictConfig) -> tuple[list[int], list[int]] | None:
    """(each prompt's question tokens, its row index), from the same rendering as `prompt_lengths` (cached);
    None where that is None."""
    rendered = _rendered(cfg)
    return None if rendered is None else rendered[1:]


def _rendered(cfg: DictConfig) -> tuple[list[int], list[int], list[int]] | None:
    """`prompt_tokens` with the model's tokenizer alone, cached per model, task and data for the process."""
    from kvbench.models import tokenizer_of

    model = {k: v for k, v in OmegaConf.to_container(cfg.model, resolve=True).items() if k not in NOT_TOKENIZER}
    key = json.dumps([model, OmegaConf.to_container(cfg.task, resolve=True), cfg.data.dir], sort_keys=True,
                     default=str)
    if key not in _lengths:
        try:
            tok = tokenizer_of(cfg)
        except (OSError, ValueError) as e:  # damaged or missing tokenizer files (ConfigError passes through)
            if isinstance(e, ConfigError):
                raise
            first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
            raise ConfigError("model", f"its tokenizer cannot be loaded: {first}", cfg.model.get("name")) from None
        if tok is None:
            return None
        _lengths[key] = prompt_tokens(build_task(cfg), tok)
    return _lengths[key]

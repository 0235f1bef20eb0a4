"""What a run needs beyond its config's own checks (kvbench.config.validate), checked before any model loads.

`check_run(cfg)`, on a prepared config (`kvbench.config.prepare`: its presets applied), called by the CLI's
preflight for every job of a command line and again by the runner:

- the default model's package is installed (its config is read from it); then what the model's config alone tells (shipped with kvbench for the `model=` choices, so these refusals
  need neither the weights nor the Hub): the model's family is one kvbench runs exactly
  (kvbench.models.family), and the run suits its attention: serve mode needs full attention without sinks or
  soft-capping, an evicting policy needs a full-attention layer to compress, re-rotation needs plain RoPE and
  no windowed layer;
- then the model's files can be had: a Hub model is in the local cache or the Hub answers within seconds (no
  retries: one line saying how to get it);
- the positions the model's config declares (kvbench.config.positions; mode=run and serve): a RULER
  `task.context_length` (checked before the model's files are asked for), each prompt, and prompt +
  `gen.max_new_tokens`;
- the prompts: the task's samples rendered with the model's tokenizer alone (no weights,
  kvbench.config.prompt_lengths), so a task limit that cannot be met (`task.max_input_tokens` below a prompt's
  fixed part) or a row that renders empty stops here, not after loading; the model's family is checked
  again for the longest sequence, and a length-dependent RoPE for the prompts' range;
- task.query_aware=false: each prompt's question leaves room in the budget of every layer the policy
  compresses (kvbench.budgets.question, the engine's own rule, on the prompt's and its question's lengths);
- mode=serve: a pool (`serve.num_blocks`) that can hold each request alone under the policy and schedule
  (a decode_only request holds its whole prompt, the full cache its whole sequence);
- last, the results folder and its runs.jsonl can be written (a probe file; runs.jsonl opened for
  appending), so a run never computes everything and then fails to save it.

Prompt lengths and model configs are cached per process (a sweep renders each task once). Side effects:
the tokenizer's files are read, the Hub may be asked (within seconds), and a probe file is written.
"""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from kvbench.config.groups import build_policy
from kvbench.config.positions import check_positions, check_task_positions
from kvbench.config.prompt_lengths import NOT_TOKENIZER, prompt_lengths, question_lengths
from kvbench.errors import ConfigError
from kvbench.results import RUNS, probe_writable

__all__ = ["check_run", "prompt_lengths", "model_config", "check_family", "check_prompt_rope", "check_rope",
           "check_question_room", "check_pool", "check_results_dir"]


def check_run(cfg: DictConfig) -> list[int] | None:
    """Every check above; returns the prompts' token counts (None for a loader kvbench does not know)."""
    from kvbench.models import check_available, check_loadable

    check_available(cfg)  # what reading the model's config needs (the default model's package)
    check_family(cfg)  # from the config alone (shipped for the `model=` choices): before the weights' files
    check_rope(cfg)
    generates = cfg.mode in ("run", "serve")
    if generates:  # a RULER context past the model's positions, before its prompts are rendered
        check_task_positions(cfg, model_config(cfg))
    check_loadable(cfg)
    lengths = prompt_lengths(cfg)
    if generates:  # prompt + gen.max_new_tokens within them (kvbench.config.positions)
        check_positions(cfg, model_config(cfg), lengths)
    if lengths is not None:
        check_family(cfg, max(lengths, default=0) + cfg.gen.max_new_tokens)
        check_prompt_rope(cfg, lengths)
        check_question_room(cfg, lengths)
        check_pool(cfg, lengths)
    check_results_dir(cfg.results_dir)
    return lengths


_configs: dict[str, object] = {}


def model_config(cfg: DictConfig):
    """The model's transformers config from its loader's weight-free twin (cached per model config), or None
    for a loader kvbench does not know."""
    from hydra.utils import get_method

    from kvbench.models import SPECS

    args = {k: v for k, v in OmegaConf.to_container(cfg.model, resolve=True).items() if k != "_target_"}
    key = json.dumps([cfg.model.get("_target_"), {k: v for k, v in args.items() if k not in NOT_TOKENIZER}],
                     sort_keys=True, default=str)
    if key not in _configs:
        loader = get_method(cfg.model._target_)
        _configs[key] = SPECS[loader](**{**args, "device": "cpu"}).config if loader in SPECS else None
    return _configs[key]


def check_family(cfg: DictConfig, seq_len: int | None = None) -> None:
    """The model's family runs exactly, and this run (sequences of at most `seq_len` tokens, None: any windowed
    layer counts) suits its attention (module docstring)."""
    config = model_config(cfg)
    if config is None:
        return
    from kvbench.models.family import check_policy, kinds

    k = kinds(config)  # ConfigError naming the family when kvbench refuses it
    if cfg.mode == "serve" and not k.plain:
        raise ConfigError("mode", f"serve mode runs full attention only; model family {k.family!r} has "
                          f"{k.describe()} (run it with mode=run)", cfg.mode)
    if cfg.mode != "serve_limits" and seq_len is not None:
        check_policy(config, build_policy(cfg), seq_len)
    if cfg.gen.get("kv_cache_dtype", "auto") != "auto":  # a quantized cache's group must divide the head size
        from kvbench.quant.qconfig import head_dims, kv_quant

        kv_quant(cfg.gen, head_dim=head_dims(k))


def family_checked(cfg: DictConfig, lengths: list[int] | None) -> bool:
    """Whether `check_run` checked the policy against the model's family for prompts of these `lengths` (the
    run then needs no second check once the model is loaded, when its prompts have these lengths)."""
    return lengths is not None and cfg.mode != "serve_limits" and model_config(cfg) is not None


def check_question_room(cfg: DictConfig, lengths: list[int]) -> None:
    """task.query_aware=false: each prompt's question leaves room in every layer the policy compresses, by the
    engine's own rule (kvbench.budgets.question) on the prompt's lengths, each prompt alone (a batch's padding
    only windows more layers, so a prompt that passes alone passes in any batch)."""
    questions, rows = question_lengths(cfg)
    config = model_config(cfg)
    policy = build_policy(cfg)
    if config is None or not any(questions) or not policy.evicts:
        return
    policy.check_model(config)  # what the model's config tells the policy (DuoAttention: its pattern's windows)
    import torch

    from kvbench.budgets import knobs, question
    from kvbench.models.family import kinds

    q = torch.tensor(questions, dtype=torch.long)  # (N,)
    context = torch.tensor(lengths, dtype=torch.long) - q  # (N,) what the engine's budgets come from
    windows = kinds(config).windows
    seq = torch.tensor(lengths) + q + cfg.gen.max_new_tokens  # (N,) as the engine's batch of one sizes it
    win = torch.tensor([torch.iinfo(torch.long).max if w is None else w for w in windows])  # (L,) None: full
    full = win[:, None] >= seq[None, :]  # (L, N) the layers compressed (a window W >= the sequence cuts nothing)
    budgets = torch.cat([knobs.layer_budgets(policy, [c], len(windows), full[:, b].nonzero()[:, 0].tolist())
                         for b, c in enumerate(context.tolist())], dim=1)  # (L, N): each prompt's own pyramid
    bad = full & question.no_room(policy, budgets, context[None, :], q[None, :])  # (L, N)
    if bool(bad.any()):
        layer, b = (int(i) for i in bad.nonzero()[0])
        why = question.refusal(questions[b], int(budgets[layer, b]),
                               int(question.protected(policy, budgets[layer, b : b + 1])[0]))
        raise ConfigError("task.query_aware", f"row {rows[b]}, layer {layer}: {why}", False)


def check_prompt_rope(cfg: DictConfig, lengths: list[int]) -> None:
    """A length-dependent RoPE (longrope, dynamic) is computed as transformers computes it (kvbench.models.family)."""
    config = model_config(cfg)
    if config is None or not lengths or cfg.mode not in ("run", "serve"):
        return
    from kvbench.models.family import check_length_rope, rope_kind, rope_length_limit

    new, limit = cfg.gen.max_new_tokens, rope_length_limit(config)
    if cfg.mode == "serve":
        if limit is not None and max(lengths) + new > limit:
            raise ConfigError("mode", f"serve mode mixes requests in one forward, whose largest position sets every "
                              f"request's {rope_kind(config)} RoPE; sequences of up to {max(lengths) + new} tokens "
                              f"pass its {limit}-position switch (run it with mode=run)", cfg.mode)
        return
    policy, chunk = build_policy(cfg), cfg.gen.prefill_chunk
    if policy.evicts_in_prefill:
        chunk = chunk or policy.evict_every
    check_length_rope(config, min(lengths), max(lengths), new, bool(chunk) and max(lengths) > chunk)


def check_rope(cfg: DictConfig) -> None:
    """policy.rerotate=true needs plain RoPE (read from the model's config, without its weights)."""
    policy = build_policy(cfg)
    if not (policy.rerotate and policy.evicts):
        return
    from kvbench.models.family import rope_problem

    config = model_config(cfg)
    if config is not None:
        why = rope_problem(config)
        if why:
            raise ConfigError("policy.rerotate", f"needs plain RoPE: {why} (model={cfg.model.name})", True)


def check_pool(cfg: DictConfig, lengths: list[int]) -> None:
    """mode=serve: each request's own budget leaves it room to run, and with a fixed pool each request alone
    fits it (else the engine would wait forever): kvbench.serve.fit.check_requests."""
    if cfg.mode not in ("serve", "serve_limits"):
        return
    from kvbench.serve.fit import check_requests

    config = model_config(cfg)
    check_requests(cfg, build_policy(cfg), lengths, lambda: getattr(config, "num_hidden_layers", 1), config)


def check_results_dir(results_dir: str) -> None:
    """The results folder exists or can be made, and it and its runs.jsonl can be written."""
    d = Path(results_dir)
    for name, is_file in ((RUNS, True), ("predictions", False), ("scores", False)):
        path = d / name
        if path.exists() and path.is_file() != is_file:
            raise ConfigError("results_dir", f"{path} must be a {'file' if is_file else 'folder'}", results_dir)
    try:
        probe_writable(d)
        with open(d / RUNS, "ab"):
            pass
    except OSError as e:
        raise ConfigError("results_dir", f"cannot be written: {e.strerror or e}", results_dir) from None

"""The model_args of kvbench's lm-eval model (kvbench.lmeval), checked and turned into a kvbench config before
any weight loads: a bad one is a ConfigError, one line naming the model_arg as the user wrote it.

model_args: `model` and `policy` (kvbench config names), `device`, `dtype`, `attention`, `prefill_chunk`
(kvbench's `device`, `model.dtype`, `gen.attention`, `gen.prefill_chunk`), the adapter's own `add_bos_token`,
`max_gen_toks` (tokens generated when a request sets none: lm_eval's default, 256, as its HFLM) and
`prefix_token_id` (HFLM's: what an empty context is conditioned on), and every key of the policy's config
(`kv_size`, `evict_every`...). Values are read as the `kvbench` command reads overrides (`null`, `true`,
numbers). Refused, each in one line: a key that is none of these (a typo), lm_eval's own options put in
model_args (`batch_size`, `max_batch_size`), an unknown model or policy, a value of the wrong type or one
kvbench's checks refuse (kvbench.config.prepare), and what the model needs before loading
(kvbench.config.preflight: its files, its family). Messages use model_args' names (`kv_size`, not
`policy.kv_size`).
A `kvbench-lm-eval` command line is read by kvbench.lmeval_command.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from omegaconf import DictConfig

from kvbench.errors import ConfigError

CONFIG_KEYS = {"model": "model", "policy": "policy", "device": "device", "dtype": "model.dtype",
               "attention": "gen.attention", "prefill_chunk": "gen.prefill_chunk"}
ADAPTER_KEYS = ("add_bos_token", "max_gen_toks", "prefix_token_id")
LM_EVAL_OPTIONS = ("batch_size", "max_batch_size")  # lm_eval gives them to the model itself
MAX_GEN_TOKS = 256  # lm_eval's HFLM.max_gen_toks
DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class Setup:
    """A checked configuration: kvbench's config and the adapter's own settings."""

    cfg: DictConfig
    batch_size: int = 1
    add_bos_token: bool = False
    max_gen_toks: int = MAX_GEN_TOKS
    prefix_token_id: int | None = None


def from_lm_eval(arg_dict: dict, additional_config: dict | None = None) -> dict:
    """The keyword arguments of the model from lm_eval's model_args and its own options (batch_size,
    max_batch_size, device). lm_eval's device (cuda:0 from its command line unless given) is used only where
    the model_args name none and CUDA is there; else kvbench's device=auto."""
    args = dict(arg_dict)
    for key in LM_EVAL_OPTIONS:
        if key in args:
            raise ConfigError(key, f"is lm_eval's own option, not a model_arg: give --{key} (simple_evaluate("
                              f"{key}=...))", args[key])
    extra = {k: v for k, v in (additional_config or {}).items() if v is not None}
    device = extra.pop("device", None)
    if "device" not in args and device and (not str(device).startswith("cuda") or _cuda()):
        args["device"] = device
    return {**args, **extra}


def configure(kwargs: dict) -> Setup:
    """The checked setup of the model's keyword arguments (module docstring); ConfigError on the first bad one."""
    args = {k: v for k, v in kwargs.items() if not (k == "device" and v in (None, ""))}
    model, policy = args.pop("model", DEFAULT_MODEL), args.pop("policy", "full")
    _known("model", model)
    _known("policy", policy)
    batch_size = _batch_size(args.pop("batch_size", 1))
    args.pop("max_batch_size", None)  # for auto batch sizes, which kvbench refuses
    own = {k: _value(k, args.pop(k)) for k in ADAPTER_KEYS if k in args}
    from kvbench.conf import load_option

    keys = [k for k in load_option("policy", policy) if k != "_target_"]
    for key, value in args.items():
        if key not in CONFIG_KEYS and key not in keys:
            ours = ", ".join([*CONFIG_KEYS, *ADAPTER_KEYS])
            raise ConfigError(key, f"is not a model_arg of kvbench's lm-eval model ({ours}) nor a key of policy "
                              f"{policy} ({', '.join(keys)})", value)
    pairs = [("model", f"model={model}"), ("policy", f"policy={policy}")]
    pairs += [(k, f"{CONFIG_KEYS.get(k, f'policy.{k}')}={_text(k, v)}") for k, v in args.items()]
    cfg = _compose(pairs, args)
    from kvbench.config import prepare
    from kvbench.config.preflight import check_family, check_rope, model_config
    from kvbench.models import check_loadable, resolve_device, resolve_dtype

    try:
        prepare(cfg)
        resolve_dtype(cfg.model.get("dtype", "auto"), resolve_device(cfg.device))  # not every check reads it
        check_loadable(cfg)
        check_family(cfg)
        check_rope(cfg)
        setup = Setup(cfg, batch_size, **{k: _adapter(k, v) for k, v in own.items()})
        vocab = getattr(model_config(cfg), "vocab_size", None)
    except ConfigError as e:
        raise in_model_args(e) from None
    if setup.prefix_token_id is not None and vocab is not None and setup.prefix_token_id >= vocab:
        raise ConfigError("prefix_token_id", f"must be a token id of the model (below {vocab})", setup.prefix_token_id)
    return setup


def in_model_args(e: ConfigError) -> ConfigError:
    """kvbench's ConfigError with its config keys named as model_args (`policy.kv_size` -> `kv_size`)."""
    shown = e.key if e.value is None else f"{e.key}={e.value}"
    message = str(e)[len(shown) + 2:] if str(e).startswith(f"{shown}: ") else str(e)
    names = {v: k for k, v in CONFIG_KEYS.items()}
    rename = lambda m: names.get(m.group(0), m.group(2) if m.group(1) == "policy" else m.group(0))  # noqa: E731
    pattern = r"\b(policy|model|gen)\.(\w+)"
    return ConfigError(re.sub(pattern, rename, e.key), re.sub(pattern, rename, message), e.value)


def _known(group: str, name) -> None:
    from kvbench.conf import options

    if not isinstance(name, str) or name not in options(group):
        raise ConfigError(group, f"unknown kvbench {group} (available: {', '.join(options(group))})", name)


def _batch_size(value) -> int:
    if str(value).startswith("auto"):
        raise ConfigError("batch_size", "auto is not supported by kvbench's lm-eval model: give a number", value)
    try:
        size = int(str(value))
    except ValueError:
        size = 0
    if size <= 0:
        raise ConfigError("batch_size", "must be a positive integer", value)
    return size


def _value(key: str, value):
    """A model_arg's value as the kvbench command reads an override's (Hydra's grammar)."""
    if not isinstance(value, str):
        return value
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        return OverridesParser.create().parse_override(f"x={value}").value()
    except Exception:
        raise ConfigError(key, "is not a value kvbench reads (quote it, or give a number, true/false or null)",
                          value) from None


def _text(key: str, value) -> str:
    value = _value(key, value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _adapter(key: str, value):
    """add_bos_token (true/false), max_gen_toks (a positive integer), prefix_token_id (a token id or null)."""
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if key == "add_bos_token" and not isinstance(value, bool):
        raise ConfigError(key, "must be true or false", value)
    if key == "max_gen_toks" and not (is_int and value > 0):
        raise ConfigError(key, "must be a positive integer (tokens a request generates unless it says)", value)
    if key == "prefix_token_id" and value is not None and not (is_int and value >= 0):
        raise ConfigError(key, "must be a token id (a non-negative integer) or null", value)
    return value


def _compose(pairs: list[tuple[str, str]], args: dict) -> DictConfig:
    """kvbench's config with these overrides; one Hydra cannot take (a value of the wrong type) named as given."""
    from hydra import compose, initialize_config_dir

    from kvbench.config import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="lm_eval"):
        try:
            return compose("config", overrides=[o for _, o in pairs])
        except Exception:
            for i, (key, _) in enumerate(pairs):  # the first override it cannot take
                try:
                    compose("config", overrides=[o for _, o in pairs[: i + 1]])
                except Exception as e:
                    cause = str(e.__cause__ or e).strip().splitlines()
                    raise ConfigError(key, cause[0] if cause else type(e).__name__, args.get(key)) from None
            raise


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()

"""A `kvbench-lm-eval` command line read before lm_eval starts, so the console script refuses what kvbench's model
cannot run in one line before any model loads: the model_args and lm_eval options of a command running the model
`kvbench` (its flags over a --config YAML's, as lm_eval merges them; checked by kvbench.lmeval_args) and its tasks
(checked by kvbench.lmeval_tasks).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kvbench.errors import ConfigError
from kvbench.lmeval_args import from_lm_eval


def command_line(argv: list[str]) -> dict | None:
    """The model's keyword arguments (`from_lm_eval`) of a kvbench-lm-eval command line that runs the model
    `kvbench`, else None (another model, another subcommand, help)."""
    given = options(argv)
    if given is None:
        return None
    model_args = given.get("model_args") or {}
    if not isinstance(model_args, dict):
        model_args = _parse([w for words in model_args for w in words] if isinstance(model_args, list)
                            else [str(model_args)])
    return from_lm_eval(model_args, {k: given.get(k) for k in ("batch_size", "max_batch_size", "device")})


def options(argv: list[str]) -> dict | None:
    """The lm_eval options of a kvbench-lm-eval command line that runs the model `kvbench` (its flags over a
    --config YAML's; `tasks` a list of names, split at commas, as lm_eval splits them), else None."""
    argv = list(argv)
    if not argv or argv[0] in ("ls", "validate") or any(a in ("-h", "--help") for a in argv):
        return None
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flags in (("--config", "-C"), ("--model", "-M", "-m"), ("--batch_size", "-b"), ("--max_batch_size",),
                  ("--device",), ("--include_path",)):
        p.add_argument(*flags)
    for flags in (("--model_args", "-a"), ("--tasks", "-t")):
        p.add_argument(*flags, nargs="+", action="append")
    known = vars(p.parse_known_args(argv[1:] if argv[0] == "run" else argv)[0])
    given = {k: v for k, v in known.items() if v}
    if given.get("config") and Path(given["config"]).is_file():
        import yaml

        from_yaml = yaml.safe_load(Path(given["config"]).read_text()) or {}
        given = {**{k: from_yaml[k] for k in known if from_yaml.get(k)}, **given}
    if given.get("model") != "kvbench":
        return None
    tasks = given.get("tasks") or []
    words = [tasks] if isinstance(tasks, str) else [w for t in tasks for w in (t if isinstance(t, list) else [t])]
    return {**given, "tasks": [n for w in words for n in str(w).split(",") if n]}


def _parse(words: list[str]) -> dict:
    """lm_eval's model_args words (`k=v,k2=v2` each, or one JSON object) as lm_eval reads them."""
    import json

    from lm_eval.utils import simple_parse_args_string

    if len(words) == 1 and words[0].lstrip().startswith("{"):
        try:
            return dict(json.loads(words[0]))
        except ValueError:
            raise ConfigError("model_args", "is not a JSON object", words[0]) from None
    out = {}
    for word in words:
        bad = [kv for kv in word.split(",") if kv and "=" not in kv]
        if bad:
            raise ConfigError("model_args", f"must be key=value pairs separated by commas, not {bad[0]!r}", word)
        out.update(simple_parse_args_string(word))
    return out

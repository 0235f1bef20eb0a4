"""The request types of a kvbench-lm-eval command's tasks, known before any model loads, so that what kvbench's
lm-eval model cannot run with the chosen policy is refused in one line up front: log-likelihood tasks
(`multiple_choice`, `loglikelihood`) with a policy that cannot score them (`Policy.no_loglikelihood`), and
perplexity tasks (`loglikelihood_rolling`) with any policy. Found only at the first such request, the refusal
came after every generation request had run, and lm_eval wrote no results.

A task's type is its config's `output_type` (lm_eval's default, generate_until, where it says none), read from
lm_eval's task index (lm_eval 0.4.12 and later: each YAML with its includes); a group's are its members', a
tag's its tasks'. A task whose config does not say (a Python class), one given as a YAML path, or any task under
an lm_eval whose index is not read this way is built by lm_eval (its dataset loads, no model) and its
`OUTPUT_TYPE` read. A name lm_eval does not know gives None: nothing is refused, and lm_eval's run says what is
wrong as it always does.
"""

from __future__ import annotations

import logging

from kvbench.errors import ConfigError

LOGLIKELIHOOD = ("multiple_choice", "loglikelihood")
ROLLING = "loglikelihood_rolling"
ROLLING_REASON = "kvbench's lm-eval model does not run it: a rolling window over a compressed cache is not defined"


def command_types(argv: list[str], manager_for=None) -> dict[str, str] | None:
    """Task name -> output type of the tasks of a kvbench-lm-eval command line running the model `kvbench`
    (its --tasks under its --include_path), or None where they are not known. `manager_for(include_path)`: the
    lm_eval TaskManager to read (a new one by default; building its index takes seconds)."""
    from kvbench.lmeval_command import options

    given = options(argv)
    if not given or not given["tasks"]:
        return None
    lm_eval_log = logging.getLogger("lm_eval")
    level = lm_eval_log.level
    lm_eval_log.setLevel(logging.ERROR)  # the index's warnings: lm_eval's own run gives them once
    try:
        from lm_eval.tasks import TaskManager

        manager = (manager_for or (lambda path: TaskManager(include_path=path)))(given.get("include_path"))
        return output_types(given["tasks"], manager)
    finally:
        lm_eval_log.setLevel(level)


def output_types(specs: list[str], manager) -> dict[str, str] | None:
    """Task name -> output type of every task `specs` (names, glob patterns, YAML paths, as lm_eval's --tasks)
    selects through lm_eval's TaskManager `manager`; None if one is not known."""
    out: dict[str, str] = {}
    for spec in specs:
        names = [spec] if spec.endswith(".yaml") else manager.match_tasks([spec])
        if not names:
            return None
        for name in names:
            found = _from_config(manager, name, None) if not name.endswith(".yaml") else None
            found = found if found is not None else _built(manager, name)
            if found is None:
                return None
            out.update(found)
    return out


def refuse_unrunnable(policy, types: dict[str, str] | None) -> None:
    """ConfigError (one line) if a task of `types` (name -> output type) makes requests kvbench's model cannot
    run: perplexity with any policy, log-likelihoods with a policy that cannot score them."""
    types = types or {}
    rolling = [name for name, kind in types.items() if kind == ROLLING]
    if rolling:
        raise ConfigError("tasks", f"is a {ROLLING} (perplexity) task: {ROLLING_REASON}", ", ".join(rolling))
    scored = [f"{name} ({kind})" for name, kind in types.items() if kind in LOGLIKELIHOOD]
    if scored and policy.no_loglikelihood:
        raise ConfigError("policy", f"does not run on log-likelihood requests ({policy.no_loglikelihood}), which "
                          f"tasks {', '.join(scored)} make: choose another policy or run the other tasks apart",
                          policy.name)


def _from_config(manager, name: str, override: str | None) -> dict[str, str] | None:
    """The output types of a task, group or tag of lm_eval's index, read from its config; None where the config
    does not tell (a Python task, an index of another shape). `override`: the output_type a group (or a member's
    own entry in it) sets for its members, over their configs' (lm_eval's precedence)."""
    entry = getattr(manager, "task_index", {}).get(name)
    kind, cfg = getattr(getattr(entry, "kind", None), "name", None), getattr(entry, "cfg", None) or {}
    if kind == "TASK" and "class" not in cfg:
        return {name: override or cfg.get("output_type") or "generate_until"}
    if kind == "TAG":
        parts = [_from_config(manager, task, override) for task in sorted(entry.tags)]
        return None if None in parts else {k: v for part in parts for k, v in part.items()}
    if kind == "GROUP" and isinstance(cfg.get("task"), list):
        override = override or cfg.get("output_type")
        out = {}
        for member in cfg["task"]:
            member = {"task": member} if isinstance(member, str) else member
            if not isinstance(member.get("task"), str) or "group" in member:
                return None  # an inline group: lm_eval builds it
            part = _from_config(manager, member["task"], member.get("output_type") or override)
            if part is None:
                return None
            out.update(part)
        return out
    return None


def _built(manager, spec: str) -> dict[str, str] | None:
    """The output types of what lm_eval builds from `spec` (datasets load, no model), or None if it cannot."""

    def leaves(node):  # get_task_dict's nested dicts (lm_eval before 0.4.12)
        if isinstance(node, dict):
            for value in node.values():
                yield from leaves(value)
        elif hasattr(node, "OUTPUT_TYPE"):
            yield node

    try:
        if hasattr(manager, "load"):  # lm_eval 0.4.12 and later: {"tasks": {name: Task}, ...}
            tasks = list(manager.load([spec])["tasks"].values())
        else:
            from lm_eval.tasks import get_task_dict

            tasks = list(leaves(get_task_dict([spec], manager)))
    except Exception:  # noqa: BLE001  (lm_eval's own run reports it, as it always does)
        return None
    return {getattr(task.config, "task", spec): task.OUTPUT_TYPE for task in tasks}

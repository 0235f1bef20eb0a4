"""The `kvbench` command (also `python -m kvbench`): Hydra app with a preflight check.

Before Hydra runs anything, `preflight` composes the config of every job the command line asks
for (each point of a `-m` sweep, at most MAX_PREFLIGHT_JOBS), prepares it (`kvbench.config.prepare`: its
presets, then every check of the config alone) and runs `kvbench.config.preflight.check_run` (the model's
files, the prompts, serve's pool, the results folder), so a wrong override ends the command with one
line naming it and exit code 2, before any model is loaded, with no traceback. Ctrl-C ends it as
quietly as SIGTERM: one line, exit code 130 (a run in progress records itself as interrupted first).
"""

from __future__ import annotations

import json
import logging
import os
import sys

HELP_FLAGS = {"-h", "--help", "--hydra-help", "--info", "-i", "--version", "-sc", "--shell-completion"}
VALUE_FLAGS = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd"}
MAX_PREFLIGHT_JOBS = 1000
log = logging.getLogger("kvbench")
_swept: dict[str, str] = {}  # config_hash -> run_id of the jobs this process's sweep ran


def split_argv(argv: list[str]) -> tuple[list[str], bool, str, bool]:
    """(overrides, multirun, config_name, run_requested) from a Hydra command line."""
    overrides, multirun, config_name, runs = [], False, "config", True
    it = iter(range(len(argv)))
    skip = False
    for i in it:
        a = argv[i]
        if skip:
            skip = False
            continue
        if a in ("-m", "--multirun"):
            multirun = True
        elif a in VALUE_FLAGS or any(a.startswith(f + "=") for f in VALUE_FLAGS if f.startswith("--")):
            if a in ("--cfg", "-c"):
                runs = False
            if a in ("--config-name", "-cn") and i + 1 < len(argv):
                config_name = argv[i + 1]
            skip = "=" not in a
        elif a.startswith("-"):
            continue
        else:
            overrides.append(a)
    return overrides, multirun, config_name, runs


def _message(e: BaseException) -> str:
    """One line for a composition/validation error, naming the override."""
    from hydra.errors import MissingConfigException

    from kvbench.config.validate import RENAMED
    from kvbench.errors import ConfigError

    if isinstance(e, ConfigError):
        return str(e)
    renamed = next((old for old in RENAMED if old.rpartition(".")[2] in str(e)), None)
    if renamed is not None:  # a config file still setting a renamed key
        return f"{renamed}: was renamed {RENAMED[renamed]}"
    if isinstance(e, MissingConfigException) and e.missing_cfg_file:
        group, _, option = str(e.missing_cfg_file).rpartition("/")
        if group == "hydra/launcher" and option.startswith("submitit_"):  # hydra/launcher=slurm extends it
            return "hydra/launcher: SLURM needs the hydra-submitit-launcher plugin (pip install 'kvbench[slurm]')"
        opts = ", ".join(sorted(o for o in (e.options or []) if o != "__init__"))
        if group:
            return f"{group}={option}: unknown option of '{group}'" + (f" (available: {opts})" if opts else "")
        return f"{option}: config not found"
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    cause = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    if cause is not None and cause is not e:
        extra = [ln.strip() for ln in str(cause).splitlines() if ln.strip()]
        if extra and extra[0] not in lines:
            lines.append(extra[0])
    text = " ".join(ln for ln in lines if not ln.startswith(("full_key", "object_type", "To append", "Set the env")))
    return text or type(e).__name__


def policy_knobs(overrides: list[str]) -> list[str]:
    """The plain `policy.<key>=...` overrides of a command line (not `+`/`++`/`~` ones)."""
    return [o for o in overrides if "=" in o and o.split("=", 1)[0].startswith("policy.")]


def preflight(argv: list[str]) -> list[str]:
    """Compose and check every job of the command line; raise on the first bad one (every job's config before
    any job's run checks). Returns the command line Hydra is to run (`compose_jobs`)."""
    from kvbench.config import prepare
    from kvbench.config.preflight import check_run
    from kvbench.config.validate import refuse_renamed
    from kvbench.errors import ConfigError

    overrides, multirun, config_name, runs = split_argv(argv)
    if any(a in HELP_FLAGS for a in argv):
        return argv
    if multirun and not runs:  # Hydra's own refusal is a traceback
        raise ConfigError("--cfg", "prints the config of one run: it cannot be combined with -m (drop -m and give "
                          "each key one value)")
    refuse_renamed(overrides)
    argv, jobs = compose_jobs(argv)
    for job, cfg, _ in jobs if runs else []:
        if cfg.search.max_batch and any(o.split("=", 1)[0].lstrip("+~") == "batch_size" for o in job):
            raise ConfigError("batch_size", "conflicts with search.max_batch=true (the search picks the batch size)")
        prepare(cfg)
    for _, cfg, _ in jobs if runs else []:  # every job's config first: a refused sweep writes nothing
        check_run(cfg)
    return argv


def compose_jobs(argv: list[str]) -> tuple[list[str], list[tuple[list[str], object, list[str]]]]:
    """The command line Hydra is to run, and the config of every job of it (at most MAX_PREFLIGHT_JOBS).

    In a sweep, each job's policy keys its policy does not use are dropped (`kvbench.config.drop_inapplicable`,
    as the job's run will): each job is (its overrides, its config, the keys dropped); a `policy.<key>=...` that
    some job's policy has not got is forced in the returned command line (`++policy.<key>=...`), so that Hydra
    composes every job; a policy key no job's policy uses is refused (`check_knobs`)."""
    from hydra import initialize_config_dir
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from kvbench.config import CONF_DIR, drop_inapplicable
    from kvbench.config.sweep_compose import compose_each

    overrides, multirun, config_name, _ = split_argv(argv)
    knobs = policy_knobs(overrides) if multirun else []
    parsed = OverridesParser.create().parse_overrides([f"++{o}" if o in knobs else o for o in overrides])
    if multirun:
        jobs = [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch][:MAX_PREFLIGHT_JOBS]
    else:
        jobs = [overrides]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="kvbench"):
        cfgs = compose_each(config_name, jobs, {p.name for p in CONF_DIR.iterdir() if p.is_dir()})
    forced = check_knobs(knobs, cfgs)
    return ([f"++{a}" if a in forced else a for a in argv],
            [(list(job), cfg, drop_inapplicable(cfg) if multirun else []) for job, cfg in zip(jobs, cfgs, strict=True)])


def check_knobs(knobs: list[str], cfgs: list) -> set[str]:
    """A sweep's `policy.<key>=...` overrides against its jobs' policies: one that no job's policy uses but
    some job would have to ignore is refused (a typo stays an error); returns those some job's policy has not
    got (Hydra must add them there: `++`)."""
    from hydra.utils import get_class

    from kvbench.config import policy_defaults, policy_key_use
    from kvbench.errors import ConfigError

    forced = set()
    for knob in knobs:
        path, value = knob.split("=", 1)
        key = path.removeprefix("policy.")
        uses = {policy_key_use(cfg, key) for cfg in cfgs}
        if "applies" not in uses and "ignored" in uses:
            names = sorted({getattr(get_class(cfg.policy._target_), "name", "?") for cfg in cfgs})
            raise ConfigError(path, f"no policy of this sweep uses it ({', '.join(names)})", value)
        if any(key not in policy_defaults().get(cfg.policy.get("_target_"), {}) for cfg in cfgs):
            forced.add(knob)
    return forced


def _hydra_entry() -> None:
    """The Hydra app on sys.argv: each job runs (`kvbench.run.run`) and prints its summary line."""
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from kvbench.config import CONF_DIR

    @hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
    def app(cfg) -> None:
        from kvbench.errors import ConfigError
        from kvbench.run import RecordNotWritten, run

        multirun = HydraConfig.get().mode == RunMode.MULTIRUN
        if cfg.skip_existing is None:  # a re-run sweep resumes: runs already recorded ok/oom are skipped
            cfg.skip_existing = multirun
        if multirun:  # a job that is an earlier one of this sweep once its ignored keys are dropped: run once
            import copy

            from kvbench.config import config_hash, drop_inapplicable

            same = copy.deepcopy(cfg)
            ignored = drop_inapplicable(same)
            done = _swept.get(config_hash(same))
            if done is not None:
                log.info("skip: this job is run %s of this sweep%s", done,
                         f" (its policy does not use {', '.join(ignored)})" if ignored else "")
                return
        try:
            record = run(cfg, sweep=multirun)
        except ConfigError as e:  # bad input found only once the model is loaded (a budget below its weights)
            print(f"kvbench: error: {e}", file=sys.stderr)
            sys.exit(2)
        except RecordNotWritten as e:  # the results folder failed at the end: nothing lost, it says where
            print(f"kvbench: error: {e}", file=sys.stderr)
            if not multirun:
                sys.exit(1)
            return
        summary = {
            k: record.get(k)
            for k in ("status", "policy", "kv_size", "batch_size", "metrics", "throughput_tok_s", "peak_kv_bytes",
                      "peak_mem_bytes")
        }
        if record.get("search"):
            summary["search"] = {k: v for k, v in record["search"].items() if k != "trials"}
        if multirun:
            _swept[record["config_hash"]] = record.get("run_id")
        print("kvbench:", json.dumps(summary, default=str), flush=True)
        if record["status"] == "error" and HydraConfig.get().mode != RunMode.MULTIRUN:
            print(f"kvbench: run failed: {record['error']}", file=sys.stderr)
            sys.exit(1)

    app()


def checked(check, argv: list[str], prog: str):
    """Run a command's preflight `check(argv)` and return what it returns; any composition or validation
    error: one line, exit 2."""
    try:
        return check(argv)
    except Exception as e:
        print(f"{prog}: error: {_message(e)}", file=sys.stderr)
        sys.exit(2)


def quiet_interrupt(entry, prog: str) -> None:
    """Run `entry()`; Ctrl-C outside a run (inside one the runner records it and exits 130 itself): one line, 130."""
    try:
        entry()
    except KeyboardInterrupt:
        print(f"{prog}: interrupted (SIGINT)", file=sys.stderr)
        sys.exit(130)


def main(argv: list[str] | None = None) -> None:
    """`kvbench`: the preflight of every job, then the Hydra app. Exit 2: refused; 1: a run failed; 130: Ctrl-C."""
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ["KVBENCH_LAUNCHER_PID"] = str(os.getpid())  # Hydra's run/sweep dirs are per process
    _swept.clear()  # a new command: a new sweep

    def entry() -> None:
        sys.argv = [sys.argv[0], *checked(preflight, argv, "kvbench")]
        _hydra_entry()

    quiet_interrupt(entry, "kvbench")


if __name__ == "__main__":
    main()

"""The `kvbench` command (also `python -m kvbench`): Hydra app with a preflight check.

Before Hydra runs anything, `preflight` composes the config of every job the command line asks
for (each point of a `-m` sweep), validates it and runs `kvbench.preflight.check_run` (the results
folder, the model's files, the prompts, serve's pool), so a wrong override ends the command with one
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

    from kvbench.errors import ConfigError

    if isinstance(e, ConfigError):
        return str(e)
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


def preflight(argv: list[str]) -> None:
    """Compose and validate every job of the command line; raise on the first bad one."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from kvbench.config import CONF_DIR, validate
    from kvbench.preflight import check_run

    overrides, multirun, config_name, runs = split_argv(argv)
    if any(a in HELP_FLAGS for a in argv):
        return
    parser = OverridesParser.create()
    parsed = parser.parse_overrides(overrides)
    if multirun:
        jobs = [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch][:MAX_PREFLIGHT_JOBS]
    else:
        jobs = [overrides]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="kvbench"):
        for job in jobs:
            cfg = compose(config_name=config_name, overrides=list(job))
            if runs:
                if cfg.search.max_batch and any(o.split("=", 1)[0].lstrip("+~") == "batch_size" for o in job):
                    from kvbench.errors import ConfigError

                    raise ConfigError(
                        "batch_size", "conflicts with search.max_batch=true (the search picks the batch size)"
                    )
                validate(cfg)
                check_run(cfg)


def _hydra_entry() -> None:
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from kvbench.config import CONF_DIR

    @hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
    def app(cfg) -> None:
        from kvbench.errors import ConfigError
        from kvbench.runner import RecordNotWritten, run

        multirun = HydraConfig.get().mode == RunMode.MULTIRUN
        if cfg.skip_existing is None:  # a re-run sweep resumes: runs already recorded ok/oom are skipped
            cfg.skip_existing = multirun
        try:
            record = run(cfg)
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
        print("kvbench:", json.dumps(summary, default=str), flush=True)
        if record["status"] == "error" and HydraConfig.get().mode != RunMode.MULTIRUN:
            print(f"kvbench: run failed: {record['error']}", file=sys.stderr)
            sys.exit(1)

    app()


def checked(check, argv: list[str], prog: str) -> None:
    """Run a command's preflight `check(argv)`; any composition or validation error: one line, exit 2."""
    try:
        check(argv)
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
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ["KVBENCH_LAUNCHER_PID"] = str(os.getpid())  # Hydra's run/sweep dirs are per process

    def entry() -> None:
        checked(preflight, argv, "kvbench")
        sys.argv = [sys.argv[0], *argv]
        _hydra_entry()

    quiet_interrupt(entry, "kvbench")


if __name__ == "__main__":
    main()

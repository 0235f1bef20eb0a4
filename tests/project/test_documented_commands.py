"""Every command the docs show runs as printed (issue 37): README.md, docs/*.md and results/*/README.md.

The commands are read from the pages' shell blocks (```bash blocks, and plain ``` blocks that start with
a command or a `$ ` prompt): `\\` continuations joined, comments dropped, `VAR="..."` assignments
expanded where `$VAR` is used, `NAME=value` prefixes set in the environment. Each is checked in-process,
without loading weights:

- `kvbench`, `kvbench-reproduce`: the CLI's own preflight (`kvbench.cli.preflight`: every job of a sweep
  composed, validated and checked: model files, prompts rendered with the tokenizer, data rows, serve's
  pool); with `--cfg job` it composes. A `$ ` command shown with a `kvbench: error: ...` line must stop
  with that line (`(...)` stands for any text);
- `kvbench-plan`: its preflight (`kvbench.capacity.preflight`);
- `kvbench-lm-eval`: `--model kvbench` and `--tasks` given, and the console script's preflight of the model_args
  (`kvbench.lmeval_command`, `kvbench.lmeval_args`) and of the tasks the policy cannot run (`kvbench.lmeval_tasks`),
  with a shown `kvbench-lm-eval: error: ...` line as for `kvbench`;
- `kvbench-report DIR`: run on DIR's committed records (into a temporary folder, no plots); a DIR with no
  records in the checkout (the default `outputs` a documented sweep writes) is run on a committed one;
- `kvbench-gpu-check`, `pip install 'kvbench[extra]'`: the console script and the extra exist;
- `lm-eval run --model kvbench` (lm-evaluation-harness's release after 0.4.x, plugins by entry point): the
  `lm_eval.models` entry point `kvbench` in pyproject.toml loads kvbench's model class, and the model_args pass
  kvbench's preflight as `kvbench-lm-eval`'s do;
- `make TARGET`: the Makefile has the target; `python scripts/X.py --flag`: the script exists and takes
  every flag shown; `scripts/X.sh`: exists and is executable.

Nothing is written into the checkout: the results folder check records the folder instead of probing
it. `data.dir=$DATA_DIR` (and `../shared/data`) is the checkout's neighbour mirror when there is one,
else a tiny mirror in the same layout. Hub models (the paper's) are not in this machine's cache and
the Hub is not reached: for them the preflight skips the cache check and the tokenizer (the prompts'
lengths), unless the command is shown failing for that reason.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "results").glob("*/README.md")),
         ROOT / "results" / "README.md"]
SHARED_DATA = "../shared/data"  # relative to the checkout, as the docs write it
PROGRAMS = ("kvbench", "kvbench-reproduce", "kvbench-plan", "kvbench-report", "kvbench-gpu-check", "kvbench-needle",
            "kvbench-lm-eval", "lm-eval", "make", "python", "pip")
SHELL_LANGS = ("", "bash", "sh", "shell", "console")


@dataclass
class Command:
    page: str
    line: int
    words: list[str]
    env: dict[str, str] = field(default_factory=dict)
    output: list[str] = field(default_factory=list)  # the lines shown after a `$ ` command

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}:{' '.join(self.words)[:60]}"


def _is_command(word: str) -> bool:
    return word in PROGRAMS or word.startswith("scripts/")


def _split(line: str, variables: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """(leading NAME=value assignments, the command's words) of one shell line, `$VAR`s expanded."""
    expanded = re.sub(r"\$\{?(\w+)\}?", lambda m: variables.get(m[1], m[0]), line)
    words = shlex.split(expanded, comments=True)
    env = {}
    while words and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):
        k, v = words.pop(0).split("=", 1)
        env[k] = v
    return env, words


def commands_of(page: Path) -> list[Command]:
    text = page.read_text(encoding="utf-8")
    rel = str(page.relative_to(ROOT))
    out = []
    for m in re.finditer(r"^```(\w*)[^\n]*\n(.*?)^```", text, re.S | re.M):
        if m[1] not in SHELL_LANGS:
            continue
        first = text[:m.start(2)].count("\n") + 1
        logical, buf, start = [], "", None
        for i, raw in enumerate(m[2].split("\n")):
            start = first + i if start is None else start
            if raw.rstrip().endswith("\\"):
                buf += raw.rstrip()[:-1] + " "
                continue
            logical.append((start, buf + raw))
            buf, start = "", None
        prompted = any(ln.startswith("$ ") for _, ln in logical)
        variables: dict[str, str] = {}
        for n, (no, ln) in enumerate(logical):
            if prompted:
                if ln.startswith("$ "):
                    env, words = _split(ln[2:], variables)
                    out.append(Command(rel, no, words, env))
                elif ln.strip() and out and out[-1].page == rel:
                    out[-1].output.append(ln)
                continue
            env, words = _split(ln, variables)
            if not words:
                variables.update(env)
                continue
            if n == 0 and m[1] == "" and not _is_command(words[0]):
                break  # a plain block of output, not of commands
            out.append(Command(rel, no, words, env))
    return out


COMMANDS = [c for p in PAGES if p.exists() for c in commands_of(p)]


def test_the_pages_show_commands_and_no_elisions():
    """The extraction finds the commands (a page format change must not empty this test), none elided."""
    progs = {c.words[0] for c in COMMANDS}
    assert {"kvbench", "kvbench-report", "kvbench-plan", "kvbench-reproduce", "make"} <= progs, progs
    assert len([c for c in COMMANDS if c.words[0] == "kvbench"]) >= 15
    elided = [c.id for c in COMMANDS if "..." in c.words]
    assert not elided, f"commands with a literal '...' (not pasteable): {elided}"


def test_the_readme_shows_getting_starteds_commands_only():
    """One list of next commands (issue 35): the README's commands are getting-started's (or make targets), so the
    two pages cannot drift apart; and no page sends the reader outside the repository."""
    def lines(page: str) -> set[str]:
        return {" ".join(c.words) for c in COMMANDS if c.page == page}

    readme = {c for c in lines("README.md") if not c.startswith("make ")}
    assert readme and readme <= lines("docs/getting-started.md"), readme - lines("docs/getting-started.md")
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        assert "../shared" not in text, f"{page.name} points outside the repository (../shared)"
        for m in re.finditer(r"\]\(([^)#\s]+)", text):  # every relative link resolves inside the checkout
            target = m[1]
            if "://" in target or target.startswith("mailto:"):
                continue
            path = (page.parent / target).resolve()
            assert path.is_relative_to(ROOT) and path.exists(), f"{page.name}: broken or outside link {target}"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> str:
    """The mirror `data.dir=../shared/data` names: the real one next to the checkout, else a tiny one."""
    if (ROOT / SHARED_DATA).is_dir():
        return SHARED_DATA
    from tests.tasks.test_fewshot import cnndm_rows, gsm8k_rows, narrativeqa_rows, write_jsonl, write_mirror

    root = write_mirror(tmp_path_factory.mktemp("data"))
    for folder, rows in (("cnn_dailymail", cnndm_rows("test", 48)), ("narrativeqa", narrativeqa_rows("test", 16)),
                         ("gsm8k", gsm8k_rows("test", 32))):  # as many test rows as a documented command takes
        write_jsonl(root / folder / "test.jsonl", rows, gz=True)
    return str(root)


@pytest.fixture
def no_writes_no_hub(monkeypatch):
    """Results folders recorded instead of written; Hub models: no cache check, no tokenizer."""
    import kvbench.config.preflight as preflight
    import kvbench.models as models

    folders: list[str] = []
    monkeypatch.setattr(preflight, "check_results_dir", folders.append)
    check, tokenizer = models.check_loadable, models.tokenizer_of

    def hub(cfg) -> bool:
        return cfg.model.get("_target_") == "kvbench.models.load_hub"

    monkeypatch.setattr(models, "check_loadable", lambda cfg: models.check_available(cfg) if hub(cfg) else check(cfg))
    monkeypatch.setattr(models, "tokenizer_of", lambda cfg: None if hub(cfg) else tokenizer(cfg))
    return folders


def _error_pattern(line: str) -> str:
    return ".*".join(re.escape(part) for part in line.split("(...)"))


def check_kvbench(cmd: Command, args: list[str], monkeypatch, request, check=None) -> None:
    from kvbench import capacity, cli
    from kvbench.cli import _message

    prog = cmd.words[0]
    shown = [ln for ln in cmd.output if ln.startswith(f"{prog}: error:")]
    if not shown:
        request.getfixturevalue("no_writes_no_hub")
    else:  # shown refused: the same on any machine (a Hub model is never in this machine's cache)
        monkeypatch.setenv("HF_HUB_CACHE", str(request.getfixturevalue("tmp_path") / "empty-hub-cache"))
    check = check or (capacity.preflight if prog == "kvbench-plan" else cli.preflight)
    try:
        check(args)
    except Exception as e:
        got = f"{prog}: error: {_message(e)}"
        assert shown, f"{cmd.id}: refused: {got}"
        assert re.fullmatch(_error_pattern(shown[0]), got), (shown[0], got)
        return
    assert not shown, f"{cmd.id}: shown refused ({shown[0]}), but it passed"


@functools.cache
def _task_manager(include_path=None):
    """lm_eval's task index (seconds to build), once per include path for every documented command."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=include_path)


def lm_eval_preflight(prog: str, args: list[str]) -> None:
    """What kvbench-lm-eval checks before lm_eval starts: the model_args, then the tasks the policy cannot run
    (kvbench.lmeval_tasks). `lm-eval run` (lm_eval's own command) checks the model_args as the model is built."""
    from kvbench import lmeval_args, lmeval_command, lmeval_tasks
    from kvbench.config import build_policy

    policy = build_policy(lmeval_args.configure(lmeval_command.command_line(args)).cfg)
    if prog == "kvbench-lm-eval":
        lmeval_tasks.refuse_unrunnable(policy, lmeval_tasks.command_types(args, _task_manager))


def check_report(cmd: Command, args: list[str], tmp_path) -> None:
    from kvbench.report.report_cli import main

    words = list(args)
    src = Path(words[0])
    if not (ROOT / src / "runs.jsonl").is_file():  # the folder a documented sweep writes: a committed one instead
        assert src.as_posix().rstrip("/") == "outputs", f"{cmd.id}: {src} holds no records"
        words[0] = "results/example_cnndm"
    if "--out" in words:
        words[words.index("--out") + 1] = str(tmp_path / "out")
    else:
        words += ["--out", str(tmp_path / "out")]
    main([*words, "--no-plots"])
    assert (tmp_path / "out" / "tables.md").is_file()


def check_other(cmd: Command) -> None:
    prog, args = cmd.words[0], cmd.words[1:]
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    if prog == "make":
        targets = re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M)
        assert args and all(a in targets for a in args if "=" not in a), f"{cmd.id}: no such make target"
    elif prog == "pip":
        extras = [re.fullmatch(r"kvbench\[([\w,-]+)\]", a) for a in args if a.startswith("kvbench")]
        assert extras and all(e and set(e[1].split(",")) <= set(pyproject["project"]["optional-dependencies"])
                              for e in extras), cmd.id
    elif prog == "kvbench-gpu-check":
        assert prog in pyproject["project"]["scripts"]
    else:
        script = args[0] if prog == "python" else prog
        path = ROOT / script
        assert path.is_file(), f"{cmd.id}: {script} does not exist"
        if prog != "python":
            assert os.access(path, os.X_OK), f"{cmd.id}: {script} is not executable"
        source = path.read_text()
        for flag in (a.split("=")[0] for a in args if a.startswith("--")):
            assert f'"{flag}"' in source, f"{cmd.id}: {script} takes no {flag}"


@pytest.mark.parametrize("cmd", COMMANDS, ids=[c.id for c in COMMANDS])
def test_documented_command(cmd, data_dir, monkeypatch, request, tmp_path):
    monkeypatch.chdir(ROOT)  # the docs' paths are the checkout's
    prog = cmd.words[0]
    for k, v in cmd.env.items():
        monkeypatch.setenv(k, data_dir if k == "DATA_DIR" and v == SHARED_DATA else v)
    monkeypatch.setenv("DATA_DIR", data_dir)  # the experiments' mirror (${oc.env:DATA_DIR,../shared/data})
    args = [f"data.dir={data_dir}" if a in (f"data.dir={SHARED_DATA}", "data.dir=$DATA_DIR") else a
            for a in cmd.words[1:]]
    args = [data_dir if a == "$DATA_DIR" else a for a in args]  # `make crosscheck DATA_DIR=$DATA_DIR`
    if prog in ("kvbench", "kvbench-reproduce", "kvbench-plan"):
        check_kvbench(cmd, args, monkeypatch, request)
    elif prog == "kvbench-report":
        check_report(cmd, args, tmp_path)
    elif prog == "kvbench-needle":  # each policy at each length through the preflight (depths change no check)
        from kvbench import needle

        parsed, rest = needle.parse(args)
        parsed.depths = parsed.depths[:1]
        for job in needle.jobs(parsed, rest):
            check_kvbench(cmd, job, monkeypatch, request)
    elif prog in ("kvbench-lm-eval", "lm-eval"):  # lm_eval's own flags, then the console script's preflight of its model_args
        from kvbench import lmeval

        if prog == "lm-eval":  # the model comes from kvbench's entry point, as lm_eval's plugin discovery loads it
            from importlib.metadata import EntryPoint

            assert args[:1] == ["run"], f"{cmd.id}: lm-eval run ..."
            args = args[1:]
            target = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["lm_eval.models"]
            assert EntryPoint("kvbench", target["kvbench"], "lm_eval.models").load() is lmeval.KVBenchLM
        flags = dict(zip(args[::2], args[1::2], strict=False))
        assert flags.get("--model") == "kvbench" and flags.get("--tasks"), f"{cmd.id}: --model kvbench --tasks"
        check_kvbench(cmd, args, monkeypatch, request, lambda a: lm_eval_preflight(prog, a))
    else:
        assert _is_command(prog), f"{cmd.id}: no check for {prog}: add one to this test"
        check_other(cmd)

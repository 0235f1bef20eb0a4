"""The golden snapshot (issue 35): what the configuration matrix and the demo computed before the house was
rebuilt, so a refactor can show it changed nothing.

`python -m tests.golden` (run once, on the commit before the refactor) writes tests/data/golden.json:
- for every combination of the matrix's default cover (tests/matrix.py, `pairwise(seed=0)`) that runs in
  mode run or serve: its command line, its `config_hash` and every sample's generated token ids;
- for every combination refused by the preflight outside serve mode: the one line it printed;
- the `config_hash` of every run `make demo ALL=1` composes (passkey and CNN/DM).
tests/project/test_golden.py replays the command lines and compares. Keys are the command lines, not the combos'
ids, so adding an axis to the matrix does not orphan the snapshot. The mirror lives at a fixed path
(`MIRROR`), because `data.dir` is part of a run's identity.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

GOLDEN = Path(__file__).parent / "data" / "golden.json"
MIRROR = Path("/tmp/kvbench-golden-mirror")
NEW_TOKENS, SAMPLES = 6, 3


def make_mirror() -> Path:
    from tests.matrix import QUESTIONS

    (MIRROR / "gsm8k").mkdir(parents=True, exist_ok=True)
    f = MIRROR / "gsm8k" / "test.jsonl.gz"
    rows = "".join(json.dumps({"question": q, "answer": f"So {i}.\n#### {i}"}) + "\n" for i, q in enumerate(QUESTIONS))
    if not f.exists() or gzip.open(f, "rt").read() != rows:
        with gzip.open(f, "wt") as out:
            out.write(rows)
    return MIRROR


def argv(overrides: list[str], results: Path) -> list[str]:
    return [*overrides, "task=gsm8k", f"data.dir={MIRROR}", f"task.n_samples={SAMPLES}", "task.n_shot=0",
            f"gen.max_new_tokens={NEW_TOKENS}", "gen.ignore_eos=true", "logger=none", "device=cpu",
            f"results_dir={results}", "serve.plot=false"]


def run_one(overrides: list[str], results: Path) -> dict:
    """{"hash", "tokens"} of an accepted command line, or {"refused": line} of a refused one."""
    from hydra import compose, initialize_config_dir

    from kvbench import cli
    from kvbench import run as kvrun
    from kvbench.config import CONF_DIR
    from kvbench.errors import ConfigError
    from kvbench.results import read_jsonl

    args = argv(overrides, results)
    try:
        cli.preflight(args)
    except ConfigError as e:
        return {"refused": str(e)}
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=args)
    rec = kvrun.run(cfg)
    assert rec["status"] == "ok", rec.get("error")
    rows = sorted(read_jsonl(rec["predictions_path"]), key=lambda r: r["index"])
    return {"hash": rec["config_hash"], "tokens": [r["token_ids"] for r in rows]}


def demo_hashes() -> dict[str, str]:
    from hydra import compose, initialize_config_dir

    from kvbench import demo
    from kvbench.config import CONF_DIR, config_hash

    out = {}
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="demo"):
        for targs in demo.TASK_OVERRIDES.values():
            for pol in demo.POLICIES:
                cfg = compose("config", overrides=["results_dir=results/demo", *targs, *pol, f"data.dir={MIRROR}"])
                out[" ".join([*targs, *pol])] = config_hash(cfg)
    return out


def capture(results: Path) -> dict:
    from tests.matrix import pairwise

    make_mirror()
    combos = {}
    for c in pairwise(seed=0):
        if c.mode == "serve_limits":
            continue
        key = " ".join(c.overrides())
        got = run_one(c.overrides(), results / c.id)
        if "refused" in got and c.mode == "serve":
            continue  # serve mode's refusals are expected to shrink (issue 34)
        combos[key] = got
    return {"matrix": combos, "demo": demo_hashes()}


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        snap = capture(Path(d))
    GOLDEN.write_text(json.dumps(snap, indent=0, sort_keys=True) + "\n")
    n = len(snap["matrix"])
    print(f"{GOLDEN}: {n} matrix command lines, {len(snap['demo'])} demo hashes", file=sys.stderr)

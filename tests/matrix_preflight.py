"""The CLI's preflight over many combinations of the configuration matrix, fast enough for the whole product.

`Preflight(data_dir, results_dir).answers(combos)` is what `kvbench`'s preflight (kvbench.cli.preflight: compose
the command line, `prepare`, then `check_run`, which needs no model) answers for each combination's command
line (tests/matrix.py's `argv`): None when it accepts it, else the one line the CLI prints after
`kvbench: error: ` (`named(line)`: the key it names). `disagreements` compares answers with the oracle.

The checks are the real ones; two steps around them are shortened, and tests/project/test_matrix_preflight.py
checks both against `kvbench.cli.preflight` itself, line for line, on a seeded sample:
- composition: Hydra composes each choice of config groups (`policy=`, `model=`, `task=`, `logger=`) once; the
  other overrides of a command line are parsed by Hydra's own parser and applied as Hydra applies them
  (`OmegaConf.update(cfg, key, value, merge=True)`) to that config in place, those that differ from what it
  holds; `prepare` applies presets in place, so their keys are read back after each combination. At the end
  every composition is set back and must equal what Hydra first gave (nothing outlived a combination).
- `hydra.utils.instantiate` of the policy and task nodes (kvbench.config.groups): a dataclass built from the
  node's fields, the same for the same fields, so it runs once per distinct node (its result copied for each
  caller, its error raised again).

`python -m tests.matrix_preflight` runs the whole product and writes its record, tests/data/matrix_product.json:
the accepted and refused counts of each policy (in the order the policies joined the registry: a new one is
appended) and the pass's duration. docs/matrix.md states its totals.
"""

from __future__ import annotations

import copy
import json
import platform
import time
from collections.abc import Iterable
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import ClassVar

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from kvbench import cli
from kvbench.config import CONF_DIR, SERVE_PRESETS, groups, prepare
from kvbench.config.preflight import check_run
from kvbench.policies import registry
from kvbench.policies.knorm import Knorm
from tests.matrix import Combo, argv, named, product, refusal

RECORD = Path(__file__).parent / "data" / "matrix_product.json"
SAMPLE = 3000  # the default suite's seeded sample of the product
# the keys the presets set (kvbench.config.presets: the serve presets', gen.kv_quant_group's default): `prepare`
# applies them to the config in place
PRESET_KEYS = (*(f"{group}.{key}" for preset in SERVE_PRESETS.values() for group, keys in preset.items()
                 for key in keys), "gen.kv_quant_group")


class Preflight:
    def __init__(self, data_dir: Path, results_dir: Path):
        self.data_dir, self.results_dir = data_dir, results_dir
        self.parser = OverridesParser.create()
        self.parsed: dict[str, tuple[str, object] | None] = {}  # override -> (key, value); None: a group choice
        self.composed: dict[tuple[str, ...], dict] = {}  # group choices -> their composition's state
        self.built: dict[str, tuple[bool, object]] = {}  # a node's fields -> (ok, object or error)

    def override(self, text: str) -> tuple[str, object] | None:
        if text not in self.parsed:
            (o,) = self.parser.parse_overrides([text])
            assert not (o.is_add() or o.is_force_add() or o.is_delete() or o.is_sweep_override()), text
            group = (CONF_DIR / o.key_or_group).is_dir()  # Hydra's rule: a config group's choice selects a file
            self.parsed[text] = None if group else (o.key_or_group, o.value())
        return self.parsed[text]

    def answer(self, combo: Combo) -> str | None:
        args = argv(combo, self.data_dir, self.results_dir)
        choices = tuple(a for a in args if self.override(a) is None)
        state = self.composed.get(choices)
        if state is None:
            with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="kvbench"):
                cfg = compose(config_name="config", overrides=list(choices))
            state = self.composed[choices] = {"cfg": cfg, "first": OmegaConf.to_container(cfg), "base": {}, "now": {}}
        cfg, base, now = state["cfg"], state["base"], state["now"]
        sets = dict(self.override(a) for a in args if self.override(a) is not None)
        for key in (*sets, *PRESET_KEYS):
            if key not in base:
                base[key] = now[key] = OmegaConf.select(cfg, key)
        self.set(cfg, now, {**base, **sets})
        try:
            prepare(cfg)
            check_run(cfg)
            line = None
        except Exception as e:  # the CLI's own handler (kvbench.cli.checked): one line, exit 2
            line = cli._message(e)
        now.update((key, OmegaConf.select(cfg, key)) for key in PRESET_KEYS)  # `prepare` applies them in place
        return line

    @staticmethod
    def set(cfg, now: dict, values: dict) -> None:
        """Apply `values` to cfg as Hydra applies an override, those that differ from what cfg holds (`now`)."""
        for key, value in values.items():
            if (type(value), value) != (type(now[key]), now[key]):
                OmegaConf.update(cfg, key, value, merge=True)
                now[key] = value

    def check_restored(self) -> None:
        """Every composition set back is as Hydra first gave it (nothing a combination or a preset set outlived it)."""
        for choices, state in self.composed.items():
            self.set(state["cfg"], state["now"], state["base"])
            assert OmegaConf.to_container(state["cfg"]) == state["first"], choices

    def instantiate(self, real):
        """`real` (hydra.utils.instantiate) once per distinct node and keywords (module docstring)."""
        def once(node, *args, **kwargs):
            key = json.dumps([OmegaConf.to_container(node, resolve=True), args, kwargs], sort_keys=True, default=str)
            if key not in self.built:
                try:
                    self.built[key] = (True, real(node, *args, **kwargs))
                except Exception as e:
                    self.built[key] = (False, e)
            ok, out = self.built[key]
            if not ok:
                raise out.with_traceback(None)
            return copy.deepcopy(out)
        return once

    def answers(self, combos: Iterable[Combo]) -> dict[Combo, str | None]:
        """Each combination's answer (in the product's order, so that few keys change from one to the next)."""
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(groups, "instantiate", self.instantiate(groups.instantiate))
            out = {c: self.answer(c) for c in sorted(combos, key=astuple)}
        self.check_restored()
        return out


def disagreements(answers: dict[Combo, str | None]) -> list[str]:
    """Where the preflight's answer is not the oracle's (`refusal`): one line each."""
    out = []
    for c, line in answers.items():
        keys = refusal(c)
        if (line is None) != (keys is None) or (line is not None and named(line) not in keys):
            out.append(f"{c.id}: the preflight {'accepts it' if line is None else 'refuses it: ' + line}; the oracle "
                       f"{'expects a run' if keys is None else 'expects a refusal naming one of ' + ', '.join(keys)}")
    return out


def counts(refused: dict[Combo, bool], policies: Iterable[str]) -> dict:
    """{"policies": [...], "by_policy": {name: {"accepted", "refused"}}, "combinations", "refused", "accepted"}."""
    by = {p: {"accepted": 0, "refused": 0} for p in policies}
    for c, no in refused.items():
        by[c.policy]["refused" if no else "accepted"] += 1
    r = sum(v["refused"] for v in by.values())
    n = r + sum(v["accepted"] for v in by.values())
    return {"policies": list(by), "by_policy": by, "combinations": n, "refused": r, "accepted": n - r}


def recorded() -> dict:
    return json.loads(RECORD.read_text())


def newest() -> tuple[str, ...]:
    """The registered policies the record has not seen, else the last one that joined it."""
    known = recorded()["policies"]
    return tuple(p for p in registry() if p not in known) or (known[-1],)


@dataclass
class Throwaway(Knorm):
    """A copy of Knorm under a new name, registered by a test only (tests/project/test_matrix_preflight.py)."""

    name: ClassVar[str] = "zz_knorm_copy"


def main() -> None:
    """Run the whole product through the preflight, require the oracle's agreement, write the record."""
    import tempfile

    from tests.matrix import write_mirror

    old = recorded()["policies"] if RECORD.exists() else []
    policies = tuple(p for p in old if p in registry()) + tuple(p for p in registry() if p not in old)
    with tempfile.TemporaryDirectory() as d:
        start, cpu = time.perf_counter(), time.process_time()
        answers = Preflight(write_mirror(Path(d) / "data"), Path(d) / "results").answers(product(policies))
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    wrong = disagreements(answers)
    assert not wrong, "\n".join(wrong[:20])
    rec = {**counts({c: line is not None for c, line in answers.items()}, policies),
           "pass": {"wall_s": round(wall), "cpu_s": round(cpu), "python": platform.python_version(),
                    "machine": platform.machine()}}
    RECORD.write_text(json.dumps(rec, indent=1) + "\n")
    print(f"{RECORD}: {rec['combinations']:,} combinations, {rec['refused']:,} refused, {rec['accepted']:,} run; "
          f"{wall:.0f} s ({cpu:.0f} s CPU)")


if __name__ == "__main__":
    main()

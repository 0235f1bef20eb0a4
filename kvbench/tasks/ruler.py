"""RULER's synthetic tasks (Hsieh et al., 2024) as kvbench tasks, generated from a seed with no download.

One class per RULER task of `scripts/synthetic.yaml` (the same settings): the needle tasks
`niah_single_{1,2,3}`, `niah_multikey_{1,2,3}`, `niah_multivalue`, `niah_multiquery`, variable tracking
`vt`, common-words `cwe` and frequent-words `fwe` extraction; they share every mechanic (this module and ruler_make.py).
`context_length` (RULER's max_seq_length) counts the model's own tokens: the rendered prompt plus
`tokens_to_generate` (RULER's per task: 128 / 30 / 120 / 50) fit in it; the haystack is sized per sample
by bisection on its unit (a noise sentence, an essay word, a listed word). The prompt is RULER's template
in the user turn and its answer prefix starting the reply. Score: RULER's `string_match_all` (the share
of the needle values recalled) per sample, averaged with its bootstrap interval. `depth` (a share of the
context, null: RULER's random depths) places the needles, for the needle heatmap (kvbench.needle).
`query_aware=false`: the question (from the line after the context to the end of the prompt) is
prefilled only after the context is compressed (kvbench.engine). Departures: `describe()["extensions"]`.
The haystack and needle generators, one per RULER task kind, are in `ruler_make.py`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from kvbench.errors import ConfigError
from kvbench.tasks import data
from kvbench.tasks import ruler_text as rt
from kvbench.tasks.base import Sample, Task
from kvbench.tasks.ruler_make import GENERATORS

HAYSTACKS = ("noise", "essay", "needle")


@dataclass
class Ruler(Task):
    n_samples: int = 8
    split: str = "synthetic"
    context_length: int = 4096
    tokens_to_generate: int | None = None  # null: RULER's for the task
    haystack: str | None = None  # null: RULER's for the task (essay: CNN/DM from data.dir, else noise)
    depth: float | None = None  # needles at this share of the context; null: RULER's random depths

    name: ClassVar[str] = "ruler"
    abstract: ClassVar[bool] = True  # the base of the RULER tasks below, not a task of its own (kvbench.tasks)
    metric: ClassVar[str] = "string_match_all"
    kind: ClassVar[str] = "niah"
    args: ClassVar[dict] = {}

    def validate(self) -> None:
        super().validate()
        if not isinstance(self.context_length, int) or self.context_length < 64:
            raise ConfigError("task.context_length", "must be an integer >= 64 (tokens)", self.context_length)
        if self.tokens_to_generate is not None and (not isinstance(self.tokens_to_generate, int)
                                                    or self.tokens_to_generate < 0):
            raise ConfigError("task.tokens_to_generate", "must be a non-negative integer or null", self.tokens_to_generate)
        if self.haystack is not None and self.haystack not in HAYSTACKS:
            raise ConfigError("task.haystack", f"must be one of {', '.join(HAYSTACKS)} or null", self.haystack)
        if self.haystack == "essay" and not self._has_essay():
            raise ConfigError("task.haystack", "essay needs the CNN/DM mirror (data.dir with cnn_dailymail/test)",
                              self.haystack)
        if self.depth is not None and not (0.0 <= float(self.depth) <= 1.0):
            raise ConfigError("task.depth", "must be in [0, 1] or null", self.depth)

    # ------------------------------------------------------------------ settings
    @property
    def splits_question(self) -> bool:
        return True

    @property
    def gen_tokens(self) -> int:
        return rt.TEMPLATES[self.kind][2] if self.tokens_to_generate is None else self.tokens_to_generate

    @property
    def hay(self) -> str:
        want = self.haystack or self.args.get("type_haystack", "noise")
        return "noise" if want == "essay" and not self._has_essay() else want

    def _has_essay(self) -> bool:
        if not self.data_dir:
            return False
        return any((Path(self.data_dir) / "cnn_dailymail" / f"test{s}").is_file() for s in data.SUFFIXES)

    def essay(self) -> list[str]:
        from kvbench.tasks.cnndm import CNNDM

        return rt.essay_words([r["article"] for r in data.load(CNNDM.source, "test", self.data_dir)])

    def describe(self) -> dict:
        ext = [rt.DEPARTURES["seed"], rt.DEPARTURES["length"]]
        if self.kind in ("niah", "common_words_extraction"):
            ext.append(rt.DEPARTURES["words"])
        if self.kind == "variable_tracking":
            ext.append(rt.DEPARTURES["vt_icl"])
        wanted = self.haystack or self.args.get("type_haystack")
        if self.hay == "essay":
            ext.append(rt.DEPARTURES["essay"])
        elif wanted == "essay":
            ext.append(rt.DEPARTURES["essay_fallback"])
        return {**super().describe(), "context_length": self.context_length, "haystack": self.hay,
                "tokens_to_generate": self.gen_tokens, "extensions": [f"task: {e}" for e in ext]}

    # ------------------------------------------------------------------ prompts
    def samples(self, tokenizer) -> list[Sample]:
        words = self.essay() if self.hay == "essay" else None
        target = self.context_length - self.gen_tokens
        out = []
        for i in range(self.n_samples):
            def build(units: int, i=i):
                return self.make(random.Random(f"{self.seed}/{self.name}/{i}"), units, words, tokenizer)

            units = self.fit(tokenizer, lambda u: build(u)[0][0], target)
            (prompt, at), refs, meta = build(units)
            out.append(Sample(index=i, prompt=prompt, references=refs, meta={**meta, "units": units},
                              question_at=at if at >= 0 else None))
        return out

    def fit(self, tokenizer, prompt_of, target: int) -> int:
        """The most haystack units whose prompt has at most `target` tokens (bisection)."""
        def n(u: int) -> int:
            return len(self.encode(tokenizer, prompt_of(u)))

        lo = self.min_units
        if n(lo) > target:
            raise ConfigError("task.context_length", f"is too small for {self.name}: the prompt needs "
                              f"{n(lo) + self.gen_tokens} tokens with its smallest haystack", self.context_length)
        base, probe = n(lo), lo + 16
        per = max(1e-3, (n(probe) - base) / (probe - lo))
        hi = max(lo + 1, int(lo + (target - base) / per * 1.1) + 1)
        while n(hi) <= target:
            lo, hi = hi, hi * 2
        while hi - lo > 1:  # n(lo) <= target < n(hi)
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if n(mid) <= target else (lo, mid)
        return lo

    @property
    def min_units(self) -> int:
        needles = max(self.args.get("num_needle_k", 1), self.args.get("num_needle_q", 1)) * self.args.get(
            "num_needle_v", 1)
        return {"common_words_extraction": 11, "freq_words_extraction": 30, "variable_tracking": 5}.get(
            self.kind, needles)

    def prompt(self, tokenizer, template: tuple[str, str], context: str, **fmt) -> tuple[str, int]:
        """(prompt, where its question starts): the template's text after {context} to the prompt's end."""
        head, prefix = template
        prompt = self.render(tokenizer, [], head.format(context=context, **fmt), prefix.format(**fmt).lstrip())
        return prompt, prompt.rfind(head.split("{context}")[-1].format(**fmt))

    def make(self, rng: random.Random, units: int, words, tokenizer) -> tuple[tuple[str, int], list[str], dict]:
        """((prompt, question_at), references, meta) for one sample with `units` haystack units."""
        head, prefix, _ = rt.TEMPLATES[self.kind]
        return GENERATORS[self.kind](self, rng, units, words, tokenizer, (head, prefix))

    # ------------------------------------------------------------------ scoring
    def extract(self, text: str) -> str:
        return text

    def score(self, answer: str, references: list[str]) -> dict[str, float]:
        return {"string_match_all": rt.string_match_all(answer, references)}


def _task(cls_name: str, name: str, kind: str, **args) -> type[Ruler]:
    cls = type(cls_name, (Ruler,), {"__annotations__": {}, "name": name, "kind": kind, "args": args,
                                "__module__": __name__, "__doc__": f"RULER {name}: {kind} {args}"})
    return dataclass(cls)


# RULER's scripts/synthetic.yaml, the same settings
NiahSingle1 = _task("NiahSingle1", "niah_single_1", "niah", type_haystack="noise", type_needle_k="words", type_needle_v="numbers")
NiahSingle2 = _task("NiahSingle2", "niah_single_2", "niah", type_haystack="essay", type_needle_k="words", type_needle_v="numbers")
NiahSingle3 = _task("NiahSingle3", "niah_single_3", "niah", type_haystack="essay", type_needle_k="words", type_needle_v="uuids")
NiahMultikey1 = _task("NiahMultikey1", "niah_multikey_1", "niah", type_haystack="essay", num_needle_k=4)
NiahMultikey2 = _task("NiahMultikey2", "niah_multikey_2", "niah", type_haystack="needle")
NiahMultikey3 = _task("NiahMultikey3", "niah_multikey_3", "niah", type_haystack="needle", type_needle_k="uuids", type_needle_v="uuids")
NiahMultivalue = _task("NiahMultivalue", "niah_multivalue", "niah", type_haystack="essay", num_needle_v=4)
NiahMultiquery = _task("NiahMultiquery", "niah_multiquery", "niah", type_haystack="essay", num_needle_q=4)
VariableTracking = _task("VariableTracking", "vt", "variable_tracking", type_haystack="noise", num_chains=1, num_hops=4)
CommonWords = _task("CommonWords", "cwe", "common_words_extraction", freq_cw=30, freq_ucw=3, num_cw=10)
FrequentWords = _task("FrequentWords", "fwe", "freq_words_extraction", alpha=2.0)
RULER_TASKS = {t.name: t for t in (NiahSingle1, NiahSingle2, NiahSingle3, NiahMultikey1, NiahMultikey2, NiahMultikey3,
                                   NiahMultivalue, NiahMultiquery, VariableTracking, CommonWords, FrequentWords)}

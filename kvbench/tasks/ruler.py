"""RULER's 13 tasks (Hsieh et al., 2024) as kvbench tasks: generated from a seed, or kvpress's leaderboard rows.

One class per RULER task of `scripts/synthetic.yaml` (the same settings and names): the needle tasks
`niah_single_{1,2,3}`, `niah_multikey_{1,2,3}`, `niah_multivalue`, `niah_multiquery`, variable tracking
`vt`, common-words `cwe` and frequent-words `fwe` extraction, and question answering `qa_1` (SQuAD v2) and
`qa_2` (HotpotQA); they share every mechanic (this module, ruler_make.py, ruler_text.py, ruler_data.py).
`context_length` (RULER's max_seq_length) counts the model's own tokens: the rendered prompt plus
`tokens_to_generate` (RULER's per task: 128 niah / 30 vt / 120 cwe / 50 fwe / 32 qa) fit in it; the haystack
is sized per sample by bisection on its unit (a noise sentence, an essay word, a listed word, a document).
The same length is what a run generates by default (`default_new_tokens`: gen.max_new_tokens=null), so a
RULER answer is never cut short; a `gen.max_new_tokens` of another value is recorded as a departure.
The prompt is RULER's template in the user turn and its answer prefix starting the reply. Score: RULER's
`string_match_all` (qa: `string_match_part`) per sample, averaged with its bootstrap interval. `depth` (a
share of the context, null: RULER's random depths) places the needles (kvbench.needle).
`query_aware=false`: the question (from the line after the context to the end of the prompt) is prefilled
only after the context is compressed (kvbench.engine). `source=kvpress`: the prompts of kvpress's
leaderboard data set instead (ruler_data.py), rendered as kvpress's pipeline renders them.
Departures: `describe()["extensions"]`.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from kvbench.errors import ConfigError
from kvbench.tasks import ruler_data as rd
from kvbench.tasks import ruler_text as rt
from kvbench.tasks.ruler_make import GENERATORS, fit
from kvbench.tasks.ruler_text import departures
from kvbench.tasks.task import Sample, Task

HAYSTACKS = {"niah": ("noise", "essay", "needle", "cnndm"), "variable_tracking": ("noise", "essay", "cnndm")}
SOURCES = ("kvbench", "kvpress")


@dataclass
class Ruler(Task):
    n_samples: int = 8
    split: str = "synthetic"
    context_length: int = 4096
    tokens_to_generate: int | None = None  # null: RULER's for the task
    haystack: str | None = None  # null: RULER's for the task (noise | essay | needle), or cnndm
    depth: float | None = None  # needles at this share of the context; null: RULER's random depths
    source: str = "kvbench"  # kvbench: generated here | kvpress: kvpress's leaderboard rows (simonjegou/ruler)

    name: ClassVar[str] = "ruler"
    abstract: ClassVar[bool] = True  # the base of the RULER tasks below, not a task of its own (kvbench.tasks)
    metric: ClassVar[str] = "string_match_all"
    kind: ClassVar[str] = "niah"
    args: ClassVar[dict] = {}

    def validate(self) -> None:
        super().validate()
        if not isinstance(self.context_length, int) or self.context_length < 64:
            raise ConfigError("task.context_length", "must be an integer >= 64 (tokens)", self.context_length)
        t = self.tokens_to_generate
        if t is not None and (not isinstance(t, int) or isinstance(t, bool) or t < 1):
            raise ConfigError("task.tokens_to_generate", "must be a positive integer or null", t)
        if self.haystack is not None and self.haystack not in HAYSTACKS.get(self.kind, ()):
            allowed = HAYSTACKS.get(self.kind)
            raise ConfigError("task.haystack", f"must be one of {', '.join(allowed)} or null" if allowed else
                              f"{self.name} has no haystack: leave it null", self.haystack)
        if self.depth is not None and (self.kind not in HAYSTACKS or not 0.0 <= float(self.depth) <= 1.0):
            raise ConfigError("task.depth", "must be in [0, 1] or null" if self.kind in HAYSTACKS else
                              f"{self.name} places no needle: leave it null", self.depth)
        if self.source not in SOURCES:
            raise ConfigError("task.source", f"must be one of {', '.join(SOURCES)}", self.source)
        if self.source == "kvpress":
            from kvbench.tasks.ruler_kvpress import check

            check(self)
        elif self.data_dir:  # a mirror the run needs and data.dir lacks: refused here, before any model
            for source, split, *setting in rd.mirrors(self):
                if not rd.has_mirror(source, split, self.data_dir):
                    rd.rows(source, split, self.data_dir, *setting)

    def check_data(self) -> None:
        """Preflight (no model): the mirror's rows this run reads, parsed, and enough of them."""
        if self.data_dir and self.source == "kvpress":
            from kvbench.tasks.ruler_kvpress import task_rows

            task_rows(self)
        elif self.data_dir:
            self.material()

    # ------------------------------------------------------------------ settings
    @property
    def splits_question(self) -> bool:
        return True

    @classmethod
    def default_new_tokens(cls, settings: Mapping) -> int:
        """RULER's tokens_to_generate for the task (or the task's `tokens_to_generate`): what a run generates
        when gen.max_new_tokens is null (kvbench.config.presets)."""
        own = settings.get("tokens_to_generate")
        return own if isinstance(own, int) and own > 0 else rt.TEMPLATES[cls.kind][2]

    @property
    def gen_tokens(self) -> int:
        return self.default_new_tokens({"tokens_to_generate": self.tokens_to_generate})

    @property
    def hay(self) -> str | None:
        return self.haystack or self.args.get("type_haystack")

    def generation_departure(self, new_tokens: int) -> str | None:
        published = rt.TEMPLATES[self.kind][2]
        if new_tokens == published:
            return None
        return (f"task: generates at most {new_tokens} new tokens (gen.max_new_tokens; RULER's {self.name}: "
                f"{published}): a longer answer is cut")

    def describe(self) -> dict:
        out = {**super().describe(), "context_length": self.context_length, "source": self.source,
               "tokens_to_generate": self.gen_tokens}
        if self.source != "kvpress":
            out["haystack"] = self.hay
        return {**out, "extensions": [f"task: {e}" for e in departures(self)]}

    # ------------------------------------------------------------------ prompts
    def material(self):
        """What the generated prompts are made from: the essay's words, QA's (questions, documents), or None."""
        if self.kind == "qa":
            qas, docs = rd.qa_corpus(self.args["dataset"], self.data_dir)
            if self.n_samples > len(qas):
                raise ConfigError("task.n_samples", f"{self.name} has {len(qas)} questions", self.n_samples)
            return qas, docs
        return rd.haystack_words(self.hay, self.data_dir) if self.hay in rt.PROSE else None

    def samples(self, tokenizer) -> list[Sample]:
        if self.source == "kvpress":
            from kvbench.tasks.ruler_kvpress import kvpress_samples

            return kvpress_samples(self, tokenizer)
        material = self.material()
        target = self.context_length - self.gen_tokens
        out = []
        for i in range(self.n_samples):
            mine = (material[0][i], material[1]) if self.kind == "qa" else material

            def build(units: int, i=i, mine=mine):
                return self.make(random.Random(f"{self.seed}/{self.name}/{i}"), units, mine, tokenizer)

            units = fit(self, tokenizer, lambda u, b=build: b(u)[0][0], target)
            (prompt, at), refs, meta = build(units)
            out.append(Sample(index=i, prompt=prompt, references=refs, meta={**meta, "units": units},
                              question_at=at if at >= 0 else None))
        return out

    @property
    def min_units(self) -> int:
        needles = max(self.args.get("num_needle_k", 1), self.args.get("num_needle_q", 1)) * self.args.get(
            "num_needle_v", 1)
        qa_docs = 10 if self.args.get("dataset") == "hotpotqa" else 1  # HotpotQA's 10 paragraphs a question
        return {"common_words_extraction": 11, "freq_words_extraction": 30, "variable_tracking": 5,
                "qa": qa_docs}.get(self.kind, needles)

    def prompt(self, tokenizer, template: tuple[str, str], context: str, **fmt) -> tuple[str, int]:
        """(prompt, where its question starts): the template's text after {context} to the prompt's end."""
        head, prefix = template
        prompt = self.render(tokenizer, [], head.format(context=context, **fmt), prefix.format(**fmt).lstrip())
        return prompt, prompt.rfind(head.split("{context}")[-1].format(**fmt))

    def make(self, rng: random.Random, units: int, material, tokenizer) -> tuple[tuple[str, int], list[str], dict]:
        """((prompt, question_at), references, meta) for one sample with `units` haystack units."""
        head, prefix, _ = rt.TEMPLATES[self.kind]
        return GENERATORS[self.kind](self, rng, units, material, tokenizer, (head, prefix))

    # ------------------------------------------------------------------ scoring
    def extract(self, text: str) -> str:
        return text

    def score(self, answer: str, references: list[str]) -> dict[str, float]:
        match = rt.string_match_part if self.metric == "string_match_part" else rt.string_match_all
        return {self.metric: match(answer, references)}


def _task(cls_name: str, name: str, kind: str, metric: str = "string_match_all", **args) -> type[Ruler]:
    cls = type(cls_name, (Ruler,), {"__annotations__": {}, "name": name, "kind": kind, "args": args, "metric": metric,
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
QA1 = _task("QA1", "qa_1", "qa", metric="string_match_part", dataset="squad")
QA2 = _task("QA2", "qa_2", "qa", metric="string_match_part", dataset="hotpotqa")
RULER_TASKS = {t.name: t for t in (NiahSingle1, NiahSingle2, NiahSingle3, NiahMultikey1, NiahMultikey2, NiahMultikey3,
                                   NiahMultivalue, NiahMultiquery, VariableTracking, CommonWords, FrequentWords, QA1, QA2)}

"""RULER's synthetic tasks (Hsieh et al., 2024) as kvbench tasks, generated from a seed with no download.

One class per RULER task of `scripts/synthetic.yaml` (the same settings): the needle tasks
`niah_single_{1,2,3}`, `niah_multikey_{1,2,3}`, `niah_multivalue`, `niah_multiquery`, variable tracking
`vt`, common-words `cwe` and frequent-words `fwe` extraction; they share every mechanic (this module).
`context_length` (RULER's max_seq_length) counts the model's own tokens: the rendered prompt plus
`tokens_to_generate` (RULER's per task: 128 / 30 / 120 / 50) fit in it; the haystack is sized per sample
by bisection on its unit (a noise sentence, an essay word, a listed word). The prompt is RULER's template
in the user turn and its answer prefix starting the reply. Score: RULER's `string_match_all` (the share
of the needle values recalled) per sample, averaged with its bootstrap interval. `depth` (a share of the
context, null: RULER's random depths) places the needles, for the needle heatmap (kvbench.needle).
`query_aware=false`: the question (from the line after the context to the end of the prompt) is
prefilled only after the context is compressed (kvbench.engine). Departures: `describe()["extensions"]`.
"""

from __future__ import annotations

import heapq
import random
import string
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from kvbench.errors import ConfigError
from kvbench.tasks import data
from kvbench.tasks import ruler_text as rt
from kvbench.tasks.base import Sample, Task

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
        return getattr(self, f"_{self.kind}")(rng, units, words, tokenizer, (head, prefix))

    # ------------------------------------------------------------------ needle in a haystack (niah.py)
    def _positions(self, rng: random.Random, n_slots: int, n_needles: int) -> list[int]:
        if self.depth is not None:
            return [round(float(self.depth) * n_slots)] * n_needles
        return sorted(int(n_slots * d / 100) for d in rng.sample(rt.DEPTHS, n_needles))

    def _niah(self, rng, units, words, tokenizer, template):
        a = {"num_needle_k": 1, "num_needle_v": 1, "num_needle_q": 1, "type_needle_k": "words",
             "type_needle_v": "numbers", **self.args}
        num_k = max(a["num_needle_k"], a["num_needle_q"])
        keys, values, needles = [], [], []
        for _ in range(num_k):
            keys.append(rt.needle_value(rng, a["type_needle_k"]))
            vs = [rt.needle_value(rng, a["type_needle_v"]) for _ in range(a["num_needle_v"])]
            needles += [rt.NEEDLE.format(type_needle_v=a["type_needle_v"], key=keys[-1], value=v) for v in vs]
            values.append(vs)
        rng.shuffle(needles)
        depths = []
        if self.hay == "essay":
            sents = rt.sentences(rt.take_words(words, units))
            at = self._positions(rng, len(sents), len(needles))
            parts, last = [], 0
            for pos, needle in zip(at, needles, strict=True):
                parts += [" ".join(sents[last:pos]), needle]
                depths.append(pos / max(1, len(sents)))
                last = pos
            context = " ".join([*parts, " ".join(sents[last:])])
        else:
            if self.hay == "noise":
                lines = [rt.NOISE] * units
            else:  # needle: distractor needles
                lines = [rt.NEEDLE.format(type_needle_v=a["type_needle_v"], key=rt.needle_value(rng, a["type_needle_k"]),
                                          value=rt.needle_value(rng, a["type_needle_v"])) for _ in range(units)]
            at = self._positions(rng, units, len(needles)) if self.depth is not None else sorted(
                rng.sample(range(units), len(needles)))
            for pos, needle in sorted(zip(at, needles, strict=True), reverse=True):
                lines.insert(pos, needle)
                depths.append(pos / units)
            context = "\n".join(lines)
        picked = rng.sample(range(num_k), a["num_needle_q"])
        queries = [keys[i] for i in picked]
        answers = [v for i in picked for v in values[i]]
        query = ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]
        head, prefix = template
        type_v = a["type_needle_v"]
        if a["num_needle_q"] * a["num_needle_v"] == 1:  # RULER's singular wording, over template + prefix
            fix = [("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer")]
            for old, new in fix:
                head, prefix = head.replace(old, new), prefix.replace(old, new)
            type_v = type_v[:-1]
        prompt = self.prompt(tokenizer, (head, prefix), context, type_needle_v=type_v, query=query)
        return prompt, answers, {"depths": sorted(depths)}

    # ------------------------------------------------------------------ variable tracking (variable_tracking.py)
    def _chain_text(self, rng, units, words, num_chains, num_hops, var_len):
        names: list[str] = []
        while len(set(names)) < num_chains * (num_hops + 1):
            names.append("".join(rng.choices(string.ascii_uppercase, k=var_len)))
        names = list(dict.fromkeys(names))
        chains, chain_vars = [], []
        for c in range(num_chains):
            v = names[c * (num_hops + 1):(c + 1) * (num_hops + 1)]
            chain = [f"VAR {v[0]} = {rng.randint(10000, 99999)}"] + [f"VAR {v[j + 1]} = VAR {v[j]} " for j in
                                                                     range(num_hops)]
            chains.append(chain)
            chain_vars.append(v)
        if self.hay == "essay":
            sents = rt.sentences(rt.take_words(words, units))
            flat = _shuffle_sublists(chains, rng)
            at = self._positions(rng, len(sents), len(flat))
            parts, last = [], 0
            for pos, item in zip(at, flat, strict=True):
                parts += [" ".join(sents[last:pos]), item.strip() + "."]
                last = pos
            context = " ".join([*parts, " ".join(sents[last:])])
        else:
            lines = [rt.NOISE] * units
            for chain in chains:
                at = sorted(rng.sample(range(len(lines)), len(chain)))
                for j, pos in enumerate(at):
                    lines.insert(pos + j, chain[j])
            context = "\n".join(lines)
        return context.replace(". \n", ".\n"), chains[0][0].split("=")[-1].strip(), chain_vars[0]

    def _variable_tracking(self, rng, units, words, tokenizer, template):
        chains, hops = self.args.get("num_chains", 1), self.args.get("num_hops", 4)
        head, prefix = template
        # RULER's in-context example: a chain of 3-letter variables in ~500 tokens of noise, answered
        icl_ctx, icl_value, icl_vars = self._chain_text(rng, 20, words, chains, hops, 3)
        icl = (head.format(context=icl_ctx, query=icl_value, num_v=hops + 1)
               + prefix.format(query=icl_value, num_v=hops + 1) + " ".join(icl_vars))
        context, value, variables = self._chain_text(rng, units, words, chains, hops, 5)
        prompt = self.prompt(tokenizer, (icl + "\n" + head, prefix), context, query=value, num_v=hops + 1)
        return prompt, variables, {}

    # ------------------------------------------------------------------ common words (common_words_extraction.py)
    def _cwe_list(self, rng, num_words, common_repeats, uncommon_repeats, num_cw):
        pool = rt.WORDS if num_words <= len(rt.WORDS) else rt.PAIRS
        chosen = rng.sample(pool, num_words)
        common, uncommon = chosen[:num_cw], chosen[num_cw:]
        listed = common * common_repeats + uncommon * uncommon_repeats
        rng.shuffle(listed)
        return " ".join(f"{i + 1}. {w}" for i, w in enumerate(listed)), common

    def _common_words_extraction(self, rng, units, words, tokenizer, template):
        num_cw = self.args.get("num_cw", 10)
        short = self.context_length < 4096  # RULER's settings below 4k tokens
        freq_cw, freq_ucw = (6, 1) if short else (self.args.get("freq_cw", 30), self.args.get("freq_ucw", 3))
        shot_ctx, shot_answer = self._cwe_list(rng, 20 if short else 40, 3 if short else 10, 1 if short else 3,
                                               num_cw)
        context, answer = self._cwe_list(rng, units, freq_cw, freq_ucw, num_cw)
        head, prefix = template
        shot = head.format(context=shot_ctx) + " " + " ".join(f"{i + 1}. {w}" for i, w in enumerate(shot_answer))
        return self.prompt(tokenizer, (shot + "\n" + head, prefix), context), answer, {}

    # ------------------------------------------------------------------ frequent words (freq_words_extraction.py)
    def _freq_words_extraction(self, rng, units, words, tokenizer, template):
        alpha = float(self.args.get("alpha", 2.0))
        size = max(4, (self.context_length - self.gen_tokens) // 50)
        vocab: list[str] = []
        while len(set(vocab)) < size:
            vocab.append("".join(rng.choices(string.ascii_lowercase, k=6)))
        vocab = sorted(set(vocab))
        rng.shuffle(vocab)
        vocab[0] = "..."  # the top-ranked word is noise
        z = rt.zeta(alpha)
        listed = [w for k, w in enumerate(vocab, 1) for _ in range(int(units * k ** -alpha / z))]  # units: num_words
        rng.shuffle(listed)
        return self.prompt(tokenizer, template, " ".join(listed)), vocab[1:4], {}

    # ------------------------------------------------------------------ scoring
    def extract(self, text: str) -> str:
        return text

    def score(self, answer: str, references: list[str]) -> dict[str, float]:
        return {"string_match_all": rt.string_match_all(answer, references)}


def _shuffle_sublists(lists: list[list[str]], rng: random.Random) -> list[str]:
    """RULER's shuffle_sublists_heap: interleave lists at random, each kept in order."""
    heap = [(rng.random(), i, 0) for i in range(len(lists))]
    heapq.heapify(heap)
    out = []
    while heap:
        _, i, j = heapq.heappop(heap)
        out.append(lists[i][j])
        if j + 1 < len(lists[i]):
            heapq.heappush(heap, (rng.random(), i, j + 1))
    return out


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
TASKS = {t.name: t for t in (NiahSingle1, NiahSingle2, NiahSingle3, NiahMultikey1, NiahMultikey2, NiahMultikey3,
                             NiahMultivalue, NiahMultiquery, VariableTracking, CommonWords, FrequentWords)}

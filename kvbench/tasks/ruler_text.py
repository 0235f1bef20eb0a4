"""RULER's building blocks, made here without a download: templates, words, needles, the score.

From NVIDIA/RULER (scripts/data/synthetic/constants.py, niah.py, variable_tracking.py,
common_words_extraction.py, freq_words_extraction.py, qa.py; scripts/eval/synthetic/constants.py):
the task templates, answer prefixes and generation lengths word for word, the noise haystack ("The grass
is green. ..."), the needle sentence, 7-digit numbers, UUIDs, the 40 depths of `np.linspace(0, 100, 40)`,
`string_match_all` (share of the reference values found, case-insensitive, in the prediction) and
`string_match_part` (QA: any reference found).

Words: RULER's own lists, the `wonderwords` package's nouns, adjectives and verbs, vendored with their
licence in `ruler_words/` (SOURCES.txt): word needles are adjective-noun pairs (6,171,620 of them, as
RULER), CWE's words the 8,166 distinct single words; beyond 8,166 words (long contexts with a tokenizer
that packs digits) CWE draws single words from SCOWL's English list too (RULER: its english_words.json).
What still departs from RULER is said in `DEPARTURES` (and the record's extensions).
"""

from __future__ import annotations

import functools
import math
import re
import uuid
from pathlib import Path

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
PROSE = ("essay", "cnndm")  # haystacks of natural text: needles go between sentences
DEPTHS = [round(100 * i / 39) for i in range(40)]  # np.round(np.linspace(0, 100, 40)).astype(int)

TEMPLATES = {  # kind -> (template, answer prefix, tokens_to_generate): RULER's constants.py
    "niah": (
        "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. "
        "I will quiz you about the {type_needle_v} afterwards.\n{context}\n"
        "What are all the special magic {type_needle_v} for {query} mentioned in the provided text?",
        " The special magic {type_needle_v} for {query} mentioned in the provided text are", 128),
    "variable_tracking": (
        "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
        "Question: Find all variables that are assigned the value {query} in the text above.",
        " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are "
        "assigned the value {query}, they are: ", 30),
    "common_words_extraction": (
        "Below is a numbered list of words. In these words, some appear more often than others. Memorize the "
        "ones that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list?",
        " Answer: The top 10 words that appear most often in the list are:", 120),
    "freq_words_extraction": (
        "Read the following coded text and track the frequency of each coded word. Find the three most "
        "frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore "
        "the dots '....'. What are the three most frequently appeared words in the above coded text?",
        " Answer: According to the coded text above, the three most frequently appeared words are:", 50),
    "qa": (
        "Answer the question based on the given documents. Only give me the answer and do not output any other "
        "words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on the given "
        "documents. Only give me the answer and do not output any other words.\n\nQuestion: {query}",
        " Answer:", 32),
}
DOCUMENT = "Document {i}:\n{document}"  # qa.py's DOCUMENT_PROMPT
WORDS_DIR = Path(__file__).with_name("ruler_words")


@functools.cache
def word_file(name: str) -> tuple[str, ...]:
    """One vendored list, a word a line (wonderwords' _get_words_from_text_file: each line right-stripped)."""
    return tuple(w.rstrip() for w in (WORDS_DIR / f"{name}.txt").read_text(encoding="utf-8").splitlines())


@functools.cache
def key_words() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(adjectives, nouns), distinct and sorted: their pairs are RULER's word keys (niah.py's sorted set)."""
    return tuple(sorted(set(word_file("adjectivelist")))), tuple(sorted(set(word_file("nounlist"))))


def n_key_pairs() -> int:
    adjs, nouns = key_words()
    return len(adjs) * len(nouns)  # 6,171,620, every pair distinct


def word_key(rng) -> str:
    """A uniform draw from RULER's adjective-noun pairs (random.choice(words)), without building the 6.2M list."""
    adjs, nouns = key_words()
    i = rng.randrange(len(adjs) * len(nouns))
    return f"{adjs[i // len(nouns)]}-{nouns[i % len(nouns)]}"


@functools.cache
def cwe_words(n: int) -> tuple[str, ...]:
    """CWE's pool for `n` words: RULER's 8,166 single words (nouns + adjectives + verbs, distinct, sorted),
    and beyond them SCOWL's words too (RULER: english_words.json)."""
    words = tuple(sorted(set(word_file("nounlist") + word_file("adjectivelist") + word_file("verblist"))))
    return words if n <= len(words) else words + word_file("scowl_words")


DEPARTURES = {
    "cwe_words": "CWE beyond 8,166 words (RULER's wonderwords lists) draws from SCOWL's English words too "
                 "(RULER: its english_words.json)",
    "sentences": "the essay haystack is split into sentences by a regex (RULER: nltk sent_tokenize); its texts "
                 "are joined with spaces (RULER: its downloaded essays concatenated)",
    "cnndm": "haystack: CNN/DailyMail test articles (task.haystack=cnndm; RULER: Paul Graham's essays)",
    "vt_icl": "VT's in-context example holds 20 noise lines (RULER: sized to 500 tokens)",
    "seed": "each sample is generated from its own seeded random stream (kvbench: seed/task/index), so samples "
            "do not depend on n_samples (RULER: one global stream, seed 42)",
    "length": "context_length counts the rendered prompt (chat template included) plus tokens_to_generate in "
              "the model's own tokens; the haystack is sized per sample by bisection (RULER: one size, then "
              "shrunk per sample)",
}


def departures(task) -> list[str]:
    """How a RULER task as configured departs from RULER's (the record's extensions, prefixed `task: `)."""
    published, ruler_len = task.args.get("type_haystack"), TEMPLATES[task.kind][2]
    if task.source == "kvpress":
        return ["kvpress's leaderboard prompts (simonjegou/ruler): generated by RULER's scripts with the "
                f"Llama-3.1-8B tokenizer to {task.context_length} tokens (base template), so their length in this "
                "model's tokens differs; the prompt is tokenised whole (kvpress: context and question apart)"]
    ext = [DEPARTURES["seed"], DEPARTURES["length"]]
    if task.gen_tokens != ruler_len:
        ext.append(f"tokens_to_generate={task.gen_tokens} sizes the context (RULER: {ruler_len})")
    if task.hay != published:
        ext.append(f"haystack {task.hay} (task.haystack; RULER's {task.name}: {published})")
    if task.hay in PROSE:
        ext.append(DEPARTURES["sentences"])
    if task.hay == "cnndm":
        ext.append(DEPARTURES["cnndm"])
    return ext + [DEPARTURES[k] for k, kind in (("vt_icl", "variable_tracking"), ("cwe_words", "common_words_extraction"))
                  if task.kind == kind]


def number(rng) -> str:
    return str(rng.randint(10**6, 10**7 - 1))  # RULER's generate_random_number(7)


def needle_value(rng, kind: str) -> str:
    if kind == "numbers":
        return number(rng)
    if kind == "words":
        return word_key(rng)
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    raise ValueError(kind)


SENTENCE = re.compile(r"(?<=[.!?])\s+")


def sentences(text: str) -> list[str]:
    return [s for s in SENTENCE.split(text.strip()) if s]


def essay_words(articles: list[str]) -> list[str]:
    """The essay haystack's words: the articles joined, whitespace collapsed (RULER: re.sub(r'\\s+', ' '))."""
    return re.sub(r"\s+", " ", " ".join(articles)).strip().split(" ")


def take_words(words: list[str], n: int) -> str:
    repeats = (n + len(words) - 1) // len(words)
    return " ".join((words * max(1, repeats))[:n])


def zeta(alpha: float, terms: int = 100_000) -> float:
    """Riemann zeta(alpha) for alpha > 1: a partial sum and the integral of the tail (scipy.special.zeta)."""
    head = math.fsum(k ** -alpha for k in range(1, terms + 1))
    return head + terms ** (1 - alpha) / (alpha - 1) - 0.5 * terms ** -alpha


def _pred(prediction: str) -> str:
    return re.sub(r"[\x00-\x1f]", "\n", prediction.strip()).strip().lower()  # RULER's postprocess_pred


def string_match_all(prediction: str, references: list[str]) -> float:
    """RULER's per-sample string_match_all: the share of the references found in the prediction (no case)."""
    pred = _pred(prediction)
    return sum(1.0 for r in references if r.lower() in pred) / len(references)


def string_match_part(prediction: str, references: list[str]) -> float:
    """RULER's per-sample string_match_part (its QA metric): 1 if any reference is in the prediction (no case)."""
    pred = _pred(prediction)
    return max(1.0 if r.lower() in pred else 0.0 for r in references)

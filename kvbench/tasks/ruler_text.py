"""RULER's building blocks, made here without a download: templates, haystacks, words, needles, the score.

From NVIDIA/RULER (scripts/data/synthetic/constants.py, niah.py, variable_tracking.py,
common_words_extraction.py, freq_words_extraction.py; scripts/eval/synthetic/constants.py):
the task templates and answer prefixes word for word, the noise haystack ("The grass is green. ..."),
the needle sentence, 7-digit numbers, UUIDs, the 40 depths of `np.linspace(0, 100, 40)`, and
`string_match_all` (share of the reference values found, case-insensitive, in the prediction).

What cannot come from RULER without a download is replaced, and said in `DEPARTURES`:
- word needles and CWE's words: RULER draws them from the `wonderwords` lists (adjective-noun pairs
  for keys, ~4,000 nouns/adjectives/verbs for CWE); here a fixed list of common English words below
  (adjective-noun pairs from it for keys; beyond its size CWE also uses such pairs);
- the essay haystack (Paul Graham's essays): CNN/DM articles from the local mirror (`data.dir`), split
  into sentences by a regex instead of nltk's `sent_tokenize`.
"""

from __future__ import annotations

import math
import re
import uuid

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
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
}
ADJECTIVES = (
    "able bad best better big black blue bold brave brief bright broad brown busy calm careful cheap clean clear "
    "close cold cool crazy curious dark dear deep direct dry early easy empty equal exact fair false fancy fast "
    "fine firm flat fresh full funny gentle glad golden good grand great green happy hard heavy high honest hot "
    "huge humble kind large late lazy light little lively long loud low lucky mad main major mild modern narrow "
    "neat new nice noble odd old open orange pale plain polite poor proud purple quick quiet rapid rare raw ready "
    "real red rich rough round royal rude sad safe sharp short shy silent silver simple slow small smart soft "
    "solid sour spare steep still strange strict strong sudden sweet swift tall tame thick thin tidy tiny tough "
    "true ugly vast violet warm weak wet white wide wild wise wooden yellow young").split()
NOUNS = (
    "account actor airport angle animal answer apple army arrow artist baby bag ball band bank basket battle beach "
    "bean bear bed bell bird blade boat body bone book bottle box brain branch bread brick bridge brother bucket "
    "button cabin cake camera camp candle car card carpet castle cat chain chair cheese chest child church circle "
    "city cloud coat coin comb cook copper corn cotton country cow crowd cup curtain dance desk dinner doctor dog "
    "door dream dress drum eagle earth egg engine eye face farm feather fence field finger fire fish flag flower "
    "fog forest fork fox friend frog garden gate ghost gift glass glove goat grape grass guitar hammer hand hat "
    "heart hill horse house island jacket jelly jewel judge kettle key king kitchen kite knife ladder lake lamp "
    "leaf lemon letter library lion lock machine map market mirror monkey moon mountain mouse music nail needle "
    "nest night ocean office onion orchard owl painter paper park pencil piano pig pillow pipe planet plant plate "
    "pocket poem potato queen rabbit rain river road robot rock roof rope rose sail salt school sea seed sheep "
    "shelf ship shoe shop silk singer sister sky snake snow sock soldier song spoon spring square star station "
    "stone storm street sugar sun table teacher tent thread tiger toast tower town toy train tree truck tulip "
    "umbrella valley village violin wagon wall watch water whale wheel window wing winter wolf wood yard zebra").split()
VERBS = (
    "accept add admire allow answer argue arrive ask bake bathe begin believe borrow bounce breathe build burn buy "
    "call carry catch chase cheer clap climb collect count cover crawl cross cry dance decide deliver design dig "
    "drag draw dream drink drive drop earn eat enjoy enter escape explain fetch fill find fix float fly fold "
    "follow gather give glow grab grow guess guide hang help hide hold hope hunt invent join jump kick kneel "
    "knock laugh learn lend lift listen live march measure melt mix move notice obey offer open paint pass plan "
    "play point pour pray print pull push race reach read relax remember repair reply return ride ring rise roll "
    "row rub run rush sail save scream search sell send sew shake shine shout sing sink sit skip sleep slide "
    "smell smile sneeze sort speak spell spill stand stare start stay steer stir stop study swim talk taste "
    "teach tell thank think throw touch travel trust turn type unlock visit wait walk wander want wash watch "
    "wave whisper whistle win wish work worry write yawn yell").split()
WORDS = sorted(set(ADJECTIVES) | set(NOUNS) | set(VERBS))  # CWE's pool (RULER: wonderwords' three lists)
PAIRS = [f"{a}-{n}" for a in ADJECTIVES for n in NOUNS]  # word needles (RULER: wonderwords adjective-noun pairs)

DEPARTURES = {
    "words": "word needles and CWE words come from kvbench's fixed list of common English words (RULER: the "
             "wonderwords lists; adjective-noun pairs for keys as RULER)",
    "essay": "essay haystack: CNN/DM test articles from data.dir in file order (RULER: Paul Graham's essays), "
             "split into sentences by a regex (RULER: nltk sent_tokenize)",
    "essay_fallback": "essay haystack without a CNN/DM mirror in data.dir: RULER's noise haystack instead",
    "vt_icl": "VT's in-context example holds 20 noise lines (RULER: sized to 500 tokens)",
    "seed": "each sample is generated from its own seeded random stream (kvbench: seed/task/index), so samples "
            "do not depend on n_samples (RULER: one global stream, seed 42)",
    "length": "context_length counts the rendered prompt (chat template included) plus tokens_to_generate in "
              "the model's own tokens; the haystack is sized per sample by bisection (RULER: one size, then "
              "shrunk per sample)",
}


def number(rng) -> str:
    return str(rng.randint(10**6, 10**7 - 1))  # RULER's generate_random_number(7)


def needle_value(rng, kind: str) -> str:
    if kind == "numbers":
        return number(rng)
    if kind == "words":
        return rng.choice(PAIRS)
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


def string_match_all(prediction: str, references: list[str]) -> float:
    """RULER's per-sample string_match_all: the share of the references found in the prediction (no case)."""
    pred = re.sub(r"[\x00-\x1f]", "\n", prediction.strip()).strip().lower()  # RULER's postprocess_pred
    return sum(1.0 for r in references if r.lower() in pred) / len(references)

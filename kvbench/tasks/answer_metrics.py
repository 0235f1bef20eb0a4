"""Metrics, kept apart from answer extraction: ROUGE F1 and exact match of numbers.

ROUGE follows the common CNN/DailyMail evaluations: Google's `rouge-score` package, Porter stemmer
on, its default tokenizer (lower-cased alphanumeric tokens). With several references (NarrativeQA's
two answers) each metric is the best over the references. A missing package raises ImportError:
a run never reports a score of 0 because the scorer could not be loaded.
"""

from __future__ import annotations

import functools
import logging
from decimal import Decimal, InvalidOperation

ROUGE_KEYS = ("rouge1", "rouge2", "rougeL")


@functools.cache
def rouge_scorer():
    try:
        from rouge_score import rouge_scorer as rs
    except ImportError as e:
        raise ImportError("ROUGE scoring needs the rouge-score package (pip install rouge-score)") from e
    absl = logging.getLogger("absl")  # rouge-score logs "Using default tokenizer." at INFO through absl: a command's
    level = absl.level  # stderr holds kvbench's own lines only (a refusal is one line)
    absl.setLevel(max(level, logging.WARNING))
    try:
        return rs.RougeScorer(list(ROUGE_KEYS), use_stemmer=True)
    finally:
        absl.setLevel(level)


def rouge(prediction: str, references: list[str]) -> dict[str, float]:
    """F1 of ROUGE-1, ROUGE-2 and ROUGE-L, each the best over the references."""
    scorer = rouge_scorer()
    scores = [scorer.score(reference, prediction) for reference in references]
    return {k: max(s[k].fmeasure for s in scores) for k in ROUGE_KEYS}


def same_number(answer: str, reference: str) -> bool:
    """Numeric equality of two plain number strings ("18.00" == "18"); False if either is not one."""
    try:
        return Decimal(answer) == Decimal(reference)
    except InvalidOperation:
        return False

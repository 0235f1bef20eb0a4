"""Fitting a prompt into `task.max_input_tokens` by cutting the tail of its document only.

The paper limits the input to 3584 = 4096 - 512 tokens and cuts the target sample's document (the
article or the summary); the instruction, the exemplars and the question are never cut. The prompt
is rebuilt around a shorter prefix of the document (cut at a token boundary, using the tokenizer's
character offsets, so the kept text is exactly a prefix of the original) until it fits.
"""

from __future__ import annotations

from collections.abc import Callable

from kvbench.errors import ConfigError


def fit(
    build: Callable[[str], str], document: str, limit: int | None, encode: Callable[[str], list[int]], tokenizer
) -> tuple[str, bool]:
    """(prompt, cut): `build(document)`, its document cut until the prompt has at most `limit` tokens."""
    prompt = build(document)
    if limit is None:
        return prompt, False
    over = len(encode(prompt)) - limit
    if over <= 0:
        return prompt, False
    offsets = tokenizer(document, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    ends = [end for _, end in offsets]
    keep = len(ends) - over
    while keep > 0:
        prompt = build(document[: ends[keep - 1]])
        over = len(encode(prompt)) - limit
        if over <= 0:
            return prompt, True
        keep -= over
    rest = len(encode(build("")))
    raise ConfigError(
        "task.max_input_tokens", f"is too small: the prompt needs {rest} tokens besides the document", limit
    )

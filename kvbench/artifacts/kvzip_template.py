"""KVzip's reconstruction passes (kvpress 0.5.5 `KVzipPress.__call__` template split and `KVzipPress.prepare`).

KVzip (arXiv 2505.23416) scores each context pair by the attention it receives when the model is asked to repeat
the context. kvpress builds, from the tokenizer's chat template, the prefix length (the template's ids before the
user's content: those positions are never reconstructed and score 0) and the suffix ids (what follows the user's
content up to the assistant's turn); the context after the prefix is cut in chunks of `chunk_size` ids, and each
chunk gets one pass: `repeat prompt + suffix + chunk`, the repeat prompt being FIRST for chunk 0 and NEXT + the
previous chunk's last `prev_postfix_size` ids after. A pass runs at positions after the whole context.
Pure functions of a tokenizer and ids: no model.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.errors import ConfigError

FIRST = "\n\nRepeat the previous context exactly."
NEXT = "\n\nRepeat the part of the previous context exactly, starting with"
DUMMY = "dummy context"


@dataclass(frozen=True)
class ReplayPass:
    """One reconstruction pass: it scores context positions [start, end); `ids` is what the model is fed."""

    start: int
    end: int
    ids: list[int]


def template(tokenizer) -> tuple[int, list[int]]:
    """(prefix length, suffix ids) from the chat template as kvpress splits it; no chat template: (0, ids of
    "\\n"). The template is rendered with `enable_thinking=False` (Qwen3's thinking block stays out)."""
    encode = lambda text: list(tokenizer.encode(text, add_special_tokens=False))  # noqa: E731
    if getattr(tokenizer, "chat_template", None) is None:
        return 0, encode("\n")
    separator = "\n" + "#" * len(DUMMY)
    text = tokenizer.apply_chat_template([{"role": "user", "content": DUMMY + separator}],
                                         add_generation_prompt=True, tokenize=False, enable_thinking=False)
    parts = text.split(separator)
    if len(parts) != 2 or DUMMY not in parts[0]:
        raise ConfigError("model.tokenizer", "the chat template does not keep the user's content verbatim: "
                          "KVzip's prefix and suffix cannot be found")
    return len(encode(parts[0].split(DUMMY)[0])), encode(parts[1])


def chunks(ids: list[int], chunk_size: int) -> list[list[int]]:
    """kvpress's `_chunk_fn`: consecutive chunks of `chunk_size`; a context no longer than that is one chunk
    (an empty context too: one empty chunk)."""
    if chunk_size <= 0:
        raise ConfigError("policy.chunk_size", "must be positive", chunk_size)
    if len(ids) <= chunk_size:
        return [list(ids)]
    return [list(ids[i:i + chunk_size]) for i in range(0, len(ids), chunk_size)]


def passes(tokenizer, context_ids: list[int], chunk_size: int = 2048, prev_postfix_size: int = 8,
           prefix_length: int | None = None, suffix_ids: list[int] | None = None) -> list[ReplayPass]:
    """The passes over one sample's context ids (the whole prompt kvpress prefilled, template prefix included).
    `prefix_length` / `suffix_ids` default to `template(tokenizer)`; kvpress assumes without checking that the
    context starts with the template's prefix (kvbench's caller decides what to do when it does not)."""
    if prefix_length is None or suffix_ids is None:
        prefix_length, suffix_ids = template(tokenizer)
    first = list(tokenizer.encode(FIRST, add_special_tokens=False))
    later = list(tokenizer.encode(NEXT, add_special_tokens=False))
    pieces = chunks(list(context_ids)[prefix_length:], chunk_size)
    out, start = [], prefix_length
    for i, piece in enumerate(pieces):
        ask = first if i == 0 else later + pieces[i - 1][-prev_postfix_size:]
        out.append(ReplayPass(start, start + len(piece), ask + list(suffix_ids) + piece))
        start += len(piece)
    return out

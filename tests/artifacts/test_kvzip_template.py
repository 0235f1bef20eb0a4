"""KVzip's reconstruction passes: the template split and the chunked repeat prompts, on kvbench's byte tokenizer
(ChatML) and on the character tokenizer kvpress's fixtures used; checked by hand and against the reference."""

import pytest

from kvbench.artifacts.kvzip_template import FIRST, NEXT, chunks, passes, template
from kvbench.errors import ConfigError
from kvbench.models.tiny import byte_tokenizer
from tests import kvpress_tiny as T
from tests import reference_passes as R


def test_char_tokenizer_by_hand():
    tok = T.CharTokenizer()
    assert template(tok) == (len("<|u|>"), tok.encode("<|a|>"))
    ctx = T.prompt_ids(40)  # "<|u|>" then 35 ids
    got = passes(tok, ctx, chunk_size=16)
    assert [(p.start, p.end) for p in got] == [(5, 21), (21, 37), (37, 40)]
    suffix = tok.encode("<|a|>")
    assert got[0].ids == tok.encode(FIRST) + suffix + ctx[5:21]
    assert got[1].ids == tok.encode(NEXT) + ctx[13:21] + suffix + ctx[21:37]  # previous chunk's last 8 ids
    assert got[2].ids == tok.encode(NEXT) + ctx[29:37] + suffix + ctx[37:40]


@pytest.mark.parametrize("n,chunk", [(40, 16), (40, 35), (40, 34), (200, 64), (6, 4)])
def test_matches_reference(n, chunk):
    tok = T.CharTokenizer()
    ctx = T.prompt_ids(n)
    assert [(p.start, p.end, p.ids) for p in passes(tok, ctx, chunk)] == R.passes(tok, ctx, chunk)


def test_chatml_byte_tokenizer():
    tok = byte_tokenizer()
    prefix, suffix = template(tok)
    text = tok.apply_chat_template([{"role": "user", "content": "hello"}], add_generation_prompt=True, tokenize=False)
    ids = tok.encode(text, add_special_tokens=False)
    assert ids[prefix:prefix + 5] == tok.encode("hello", add_special_tokens=False)
    assert ids[prefix + 5:] == suffix  # the suffix is exactly what follows the user's content
    (one,) = passes(tok, ids, chunk_size=2048)
    assert (one.start, one.end) == (prefix, len(ids))
    assert one.ids == tok.encode(FIRST, add_special_tokens=False) + suffix + ids[prefix:]


def test_no_template_and_edges():
    tok = T.CharTokenizer()
    tok.chat_template = None
    assert template(tok) == (0, tok.encode("\n"))
    assert chunks([1, 2, 3], 3) == [[1, 2, 3]] and chunks([], 4) == [[]]  # kvpress: one (empty) chunk
    assert chunks([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]
    with pytest.raises(ConfigError):
        chunks([1], 0)

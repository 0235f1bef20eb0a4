"""kvbench's RULER prompts are RULER's: for each of the 13 tasks, RULER's prompt is rebuilt from its published
template (tests/tasks/ruler_upstream.py, vendored from NVIDIA/RULER) around kvbench's needles, and compared
with the text kvbench gives the model.

kvbench puts RULER's input (template + answer prefix, the base model template) in one user turn, the answer
prefix starting the assistant's reply; so the user turn, a space and the reply prefix are RULER's text. The
pieces kvbench drew (context, query, example) are read back with a pattern made from RULER's template alone,
then RULER's own assembly (ruler_upstream's functions) rebuilds the prompt, which must be kvbench's, and the
needles must be RULER's needle sentences (niah), chains (vt), word lists (cwe, fwe) and documents (qa).
"""

from __future__ import annotations

import collections
import re
import string

import pytest

from kvbench.models.tiny import byte_tokenizer
from kvbench.tasks import RULER_TASKS
from kvbench.tasks import ruler_data as rd
from tests.tasks import ruler_upstream as up

TOK = byte_tokenizer()  # ChatML template: <|im_start|>user\n...<|im_end|>\n<|im_start|>assistant\n
CHAT = re.compile(r"<\|im_start\|>user\n(?P<user>.*)<\|im_end\|>\n<\|im_start\|>assistant\n(?P<reply>.*)", re.S)
FIELDS = {"context": ".*", "query": ".*?", "type_needle_v": "[a-z]+", "num_v": r"\d+"}


def pattern(template: str, tag: str = "") -> str:
    """A regex of RULER's template: its text literal, each field a group (a repeated field: the same text)."""
    out, seen = [], set()
    for literal, field, _, _ in string.Formatter().parse(template):
        out.append(re.escape(literal))
        if field is not None:
            group = f"{field}{tag}"
            out.append(f"(?P={group})" if group in seen else f"(?P<{group}>{FIELDS.get(field, '.*?')})")
            seen.add(group)
    return "".join(out)


def ruler_text(sample) -> str:
    """RULER's input as kvbench renders it: the user turn, then a space and the reply's answer prefix."""
    m = CHAT.fullmatch(sample.prompt)
    assert m, sample.prompt[:200]
    return m["user"] + " " + m["reply"]


def check_niah(name: str, text: str, refs: list[str]) -> None:
    _, args = up.SYNTHETIC[name]
    m = re.fullmatch(pattern(up.template(name)), text, re.S)
    assert m, text[-300:]
    context, query = m["context"], m["query"]
    assert up.niah_input(name, context, query) == text
    keys = query.split(", and ")[-1:] if args["num_needle_q"] == 1 else re.split(r", and |, ", query)
    per_key = args["num_needle_v"]
    for i, value in enumerate(refs):  # each value in RULER's needle sentence, under its asked key
        key = keys[i // per_key]
        assert up.NEEDLE.format(type_needle_v=args["type_needle_v"], key=key, value=value) in context
    if args["type_haystack"] in ("noise", "needle"):
        needle = re.escape(up.NEEDLE).replace(r"\{type_needle_v\}", args["type_needle_v"]).replace(
            r"\{key\}", ".+").replace(r"\{value\}", ".+")
        for line in context.split("\n"):
            assert line == up.NOISE or re.fullmatch(needle, line), line
        assert args["type_haystack"] == "noise" or all(re.fullmatch(needle, ln) for ln in context.split("\n"))


def check_vt(text: str, refs: list[str]) -> None:
    m = re.fullmatch(pattern(up.template("vt"), "1") + r" (?P<answer>[A-Z ]+)\n\n" + pattern(up.template("vt"), "2"),
                     text, re.S)
    assert m, text[-300:]
    icl_vars = m["answer"].split(" ")
    assert up.vt_input(m["context1"], m["query1"], icl_vars, m["context2"], m["query2"]) == text
    assert m["num_v1"] == m["num_v2"] == "5" and len(refs) == 5
    chain = [f"VAR {refs[0]} = {m['query2']}"] + [f"VAR {refs[j + 1]} = VAR {refs[j]} " for j in range(4)]
    assert [ln for ln in m["context2"].split("\n") if ln != up.NOISE] == chain  # RULER's chain, in order


def top(counts: collections.Counter, n: int) -> list[str]:
    return [w for w, _ in counts.most_common(n)]


def check_cwe(text: str, refs: list[str]) -> None:
    cwe = pattern(up.template("cwe"))
    m = re.fullmatch(cwe.replace("(?P<context>", "(?P<example>") + r" (?P<answer>(?:\d+\. \S+ ?)+)\n" + cwe, text, re.S)
    assert m, text[-300:]
    words = re.findall(r"\d+\. (\S+)", m["answer"])
    assert up.cwe_input(m["example"], words, m["context"]) == text
    for ctx, common in ((m["example"], words), (m["context"], refs)):
        listed = re.findall(r"(\d+)\. (\S+)", ctx)
        assert [int(i) for i, _ in listed] == list(range(1, len(listed) + 1))
        counts = collections.Counter(w for _, w in listed)
        assert sorted(common) == sorted(top(counts, 10)) and counts[common[0]] > counts[top(counts, 11)[-1]]


def check_fwe(text: str, refs: list[str]) -> None:
    m = re.fullmatch(pattern(up.template("fwe")), text, re.S)
    assert m and up.fwe_input(m["context"]) == text
    counts = collections.Counter(m["context"].split(" "))
    assert top(counts, 4)[0] == "..." and top(counts, 4)[1:] == refs  # RULER: the dots rank first, then the 3


def check_qa(name: str, text: str, refs: list[str], data_dir: str) -> None:
    m = re.fullmatch(pattern(up.template(name)), text, re.S)
    assert m, text[-300:]
    docs = re.split(r"(?:^|\n\n)Document \d+:\n", m["context"])[1:]
    assert up.qa_input(docs, m["query"]) == text
    qas, corpus = rd.qa_corpus(up.SYNTHETIC[name][1]["dataset"], data_dir)
    q = next(q for q in qas if q["query"] == m["query"])
    assert set(docs) <= set(corpus) and all(corpus[i] in docs for i in q["context"]) and q["outputs"] == refs


@pytest.mark.parametrize("name", sorted(up.SYNTHETIC))
def test_prompt_is_rulers_template_around_kvbenchs_needles(name, shards):
    assert sorted(up.SYNTHETIC) == sorted(RULER_TASKS)  # the 13 tasks, RULER's names
    length = {"vt": 4000, "niah_multikey_3": 2600, "cwe": 3200, "fwe": 2000, "qa_2": 2500}.get(name, 1500)
    task = RULER_TASKS[name](n_samples=2, context_length=length, data_dir=shards)
    kind, _ = up.SYNTHETIC[name]
    assert task.kind == kind and task.gen_tokens == up.TASKS[kind]["tokens_to_generate"]
    for s in task.samples(TOK):
        text = ruler_text(s)
        if kind == "niah":
            check_niah(name, text, s.references)
        elif kind == "variable_tracking":
            check_vt(text, s.references)
        elif kind == "common_words_extraction":
            check_cwe(text, s.references)
        elif kind == "freq_words_extraction":
            check_fwe(text, s.references)
        else:
            check_qa(name, text, s.references, shards)

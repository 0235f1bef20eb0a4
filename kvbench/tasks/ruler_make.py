"""The haystacks and needles of RULER's tasks: one generator per RULER task kind.

Each generator takes the task (its settings: `args`, `hay`, `depth`, `context_length`), a seeded
`random.Random`, the haystack size in units, its material (the essay's words, QA's (questions, documents),
or None) and the tokenizer, and returns
((prompt, where its question starts), the references, meta). They follow RULER's `scripts/data/synthetic/`
scripts named in each section; `kvbench.tasks.ruler` sizes the haystack and picks the generator by the
task's `kind` (`GENERATORS`).
"""

from __future__ import annotations

import heapq
import random
import string

from kvbench.tasks import ruler_text as rt


def fit(task, tokenizer, prompt_of, target: int) -> int:
    """The most haystack units whose prompt (`prompt_of(units)`) has at most `target` tokens (bisection)."""
    from kvbench.errors import ConfigError

    def n(u: int) -> int:
        return len(task.encode(tokenizer, prompt_of(u)))

    lo = task.min_units
    if n(lo) > target:
        raise ConfigError("task.context_length", f"is too small for {task.name}: the prompt needs "
                          f"{n(lo) + task.gen_tokens} tokens with its smallest haystack", task.context_length)
    base, probe = n(lo), lo + 16
    per = max(1e-3, (n(probe) - base) / (probe - lo))
    hi = max(lo + 1, int(lo + (target - base) / per * 1.1) + 1)
    while n(hi) <= target:
        lo, hi = hi, hi * 2
    while hi - lo > 1:  # n(lo) <= target < n(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if n(mid) <= target else (lo, mid)
    return lo


# ---------------------------------------------------------------------- needle in a haystack (niah.py)
def positions(task, rng: random.Random, n_slots: int, n_needles: int) -> list[int]:
    if task.depth is not None:
        return [round(float(task.depth) * n_slots)] * n_needles
    return sorted(int(n_slots * d / 100) for d in rng.sample(rt.DEPTHS, n_needles))

def niah(task, rng, units, words, tokenizer, template):
    a = {"num_needle_k": 1, "num_needle_v": 1, "num_needle_q": 1, "type_needle_k": "words",
         "type_needle_v": "numbers", **task.args}
    num_k = max(a["num_needle_k"], a["num_needle_q"])
    keys, values, needles = [], [], []
    for _ in range(num_k):
        keys.append(rt.needle_value(rng, a["type_needle_k"]))
        vs = [rt.needle_value(rng, a["type_needle_v"]) for _ in range(a["num_needle_v"])]
        needles += [rt.NEEDLE.format(type_needle_v=a["type_needle_v"], key=keys[-1], value=v) for v in vs]
        values.append(vs)
    rng.shuffle(needles)
    depths = []
    if task.hay in rt.PROSE:
        sents = rt.sentences(rt.take_words(words, units))
        at = positions(task, rng, len(sents), len(needles))
        parts, last = [], 0
        for pos, needle in zip(at, needles, strict=True):
            parts += [" ".join(sents[last:pos]), needle]
            depths.append(pos / max(1, len(sents)))
            last = pos
        context = " ".join([*parts, " ".join(sents[last:])])
    else:
        if task.hay == "noise":
            lines = [rt.NOISE] * units
        else:  # needle: distractor needles
            lines = [rt.NEEDLE.format(type_needle_v=a["type_needle_v"], key=rt.needle_value(rng, a["type_needle_k"]),
                                      value=rt.needle_value(rng, a["type_needle_v"])) for _ in range(units)]
        at = positions(task, rng, units, len(needles)) if task.depth is not None else sorted(
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
    prompt = task.prompt(tokenizer, (head, prefix), context, type_needle_v=type_v, query=query)
    return prompt, answers, {"depths": sorted(depths)}

# ---------------------------------------------------------------------- variable tracking (variable_tracking.py)
def _chain_text(task, rng, units, words, num_chains, num_hops, var_len):
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
    if task.hay in rt.PROSE:
        sents = rt.sentences(rt.take_words(words, units))
        flat = shuffle_sublists(chains, rng)
        at = positions(task, rng, len(sents), len(flat))
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

def variable_tracking(task, rng, units, words, tokenizer, template):
    chains, hops = task.args.get("num_chains", 1), task.args.get("num_hops", 4)
    head, prefix = template
    # RULER's in-context example: a chain of 3-letter variables in ~500 tokens of noise, answered
    icl_ctx, icl_value, icl_vars = _chain_text(task, rng, 20, words, chains, hops, 3)
    # RULER's example: its input (template + answer prefix), " ", its answer, "\n"; then "\n" and the task
    icl = (head.format(context=icl_ctx, query=icl_value, num_v=hops + 1)
           + prefix.format(query=icl_value, num_v=hops + 1) + " " + " ".join(icl_vars) + "\n")
    context, value, variables = _chain_text(task, rng, units, words, chains, hops, 5)
    prompt = task.prompt(tokenizer, (icl + "\n" + head, prefix), context, query=value, num_v=hops + 1)
    return prompt, variables, {}

# ---------------------------------------------------------------------- common words (common_words_extraction.py)
def _cwe_list(rng, num_words, common_repeats, uncommon_repeats, num_cw):
    chosen = rng.sample(rt.cwe_words(num_words), num_words)
    common, uncommon = chosen[:num_cw], chosen[num_cw:]
    listed = common * common_repeats + uncommon * uncommon_repeats
    rng.shuffle(listed)
    return " ".join(f"{i + 1}. {w}" for i, w in enumerate(listed)), common

def common_words_extraction(task, rng, units, words, tokenizer, template):
    num_cw = task.args.get("num_cw", 10)
    short = task.context_length < 4096  # RULER's settings below 4k tokens
    freq_cw, freq_ucw = (6, 1) if short else (task.args.get("freq_cw", 30), task.args.get("freq_ucw", 3))
    shot_ctx, shot_answer = _cwe_list(rng, 20 if short else 40, 3 if short else 10, 1 if short else 3,
                                           num_cw)
    context, answer = _cwe_list(rng, units, freq_cw, freq_ucw, num_cw)
    head, prefix = template  # RULER's example: template + answer prefix, then its answer
    shot = head.format(context=shot_ctx) + prefix + " " + " ".join(f"{i + 1}. {w}" for i, w in enumerate(shot_answer))
    return task.prompt(tokenizer, (shot + "\n" + head, prefix), context), answer, {}

# ---------------------------------------------------------------------- frequent words (freq_words_extraction.py)
def freq_words_extraction(task, rng, units, words, tokenizer, template):
    alpha = float(task.args.get("alpha", 2.0))
    size = max(4, (task.context_length - task.gen_tokens) // 50)
    vocab: list[str] = []
    while len(set(vocab)) < size:
        vocab.append("".join(rng.choices(string.ascii_lowercase, k=6)))
    vocab = sorted(set(vocab))
    rng.shuffle(vocab)
    vocab[0] = "..."  # the top-ranked word is noise
    z = rt.zeta(alpha)
    listed = [w for k, w in enumerate(vocab, 1) for _ in range(int(units * k ** -alpha / z))]  # units: num_words
    rng.shuffle(listed)
    return task.prompt(tokenizer, template, " ".join(listed)), vocab[1:4], {}


# ---------------------------------------------------------------------- question answering (qa.py)
def qa(task, rng, units, corpus, tokenizer, template):
    """`corpus`: (the sample's question, the documents). The question over `units` documents: its gold ones,
    then its article's other paragraphs (SQuAD), then others drawn at random; shuffled, numbered."""
    q, docs = corpus
    gold, more = q["context"], q.get("more_context", [])
    if units < len(docs):
        if units - len(gold) > len(more):
            gold_more = set(gold + more)
            rest = [i for i in range(len(docs)) if i not in gold_more]
            picked = gold + more + rng.sample(rest, max(0, units - len(gold) - len(more)))
        else:
            picked = gold + rng.sample(more, units - len(gold))
        chosen = [docs[i] for i in picked]
    else:
        chosen = (docs * ((units + len(docs) - 1) // len(docs)))[:units]
    rng.shuffle(chosen)
    context = "\n\n".join(rt.DOCUMENT.format(i=i + 1, document=d) for i, d in enumerate(chosen))
    return task.prompt(tokenizer, template, context, query=q["query"]), list(q["outputs"]), {"documents": units}


def shuffle_sublists(lists: list[list[str]], rng: random.Random) -> list[str]:
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


GENERATORS = {"niah": niah, "variable_tracking": variable_tracking, "common_words_extraction": common_words_extraction,
              "freq_words_extraction": freq_words_extraction, "qa": qa}

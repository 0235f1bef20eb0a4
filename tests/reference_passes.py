"""Brute-force references of the methods that run extra forward passes: KVzip / KVzip+ (the context
reconstructed after a repeat prompt), KVgrad (the same pass, then a backward), and DuoAttention's
on-the-fly head patterns (a forward over calibration texts). Written from the papers as kvpress 0.5.5 states
them (/work/wt/43-methods-spec.md), not from kvbench's code; on tests/reference.py's decoder and weights.

`replay` is the reconstruction pass: one token at a time, at the positions after the context, each layer's
query attending to every held pair of its KV head and to the pass's own earlier pairs (full attention, as
the model runs it); the pass's pairs are its own lists, dropped with it. It records, per layer and token,
the hidden state entering attention, the query with RoPE and the attention output (differentiable, for
KVgrad's gradient).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from tests.reference import _rms_norm
from tests.reference_methods import pre_rope, value_out_norm

FIRST = "\n\nRepeat the previous context exactly."
NEXT = "\n\nRepeat the part of the previous context exactly, starting with"


def template(tok) -> tuple[int, list[int]]:
    """KVzip's chat-template split: (prefix length, suffix ids) from a user turn holding a dummy context;
    no chat template: (0, ids of "\\n")."""
    if tok.chat_template is None:
        return 0, tok.encode("\n", add_special_tokens=False)
    sep = "\n" + "#" * len("dummy context")
    text = tok.apply_chat_template([{"role": "user", "content": "dummy context" + sep}], add_generation_prompt=True,
                                   tokenize=False, enable_thinking=False)
    context, suffix = text.split(sep)
    return len(tok.encode(context.split("dummy context")[0], add_special_tokens=False)), \
        tok.encode(suffix, add_special_tokens=False)


def passes(tok, context: list[int], chunk: int, postfix: int = 8) -> list[tuple[int, int, list[int]]]:
    """The reconstruction passes over a context: (start, end) of the chunk of context positions each one
    reconstructs, and its ids: the repeat prompt (later chunks: another one + the previous chunk's last
    `postfix` ids), the template's suffix, the chunk. Chunks of `chunk` ids after the template's prefix."""
    prefix, suffix = template(tok)
    ctx = context[prefix:]
    chunks = [ctx[i : i + chunk] for i in range(0, len(ctx), chunk)]
    out, start = [], prefix
    for i, c in enumerate(chunks):
        ask = tok.encode(FIRST, add_special_tokens=False) if i == 0 else \
            tok.encode(NEXT, add_special_tokens=False) + chunks[i - 1][-postfix:]
        out.append((start, start + len(c), ask + suffix + c))
        start += len(c)
    return out


def replay(ref, cache, ids: list[int], first_pos: int, grad: bool = False):
    """The pass over `ids` at first_pos, first_pos + 1, ... against `cache` (left unchanged). Returns
    (records[layer] = [(h, q with RoPE (Hq, D), attention output (hidden,))], own[layer][kv_head] = [(k, v)],
    the last layer's outputs (before the final norm), one per token). grad: the embeddings require a
    gradient, and every attention output keeps its own."""
    own = [[[] for _ in range(ref.Hkv)] for _ in ref.layers]
    records = [[] for _ in ref.layers]
    last = []
    for t, tok in enumerate(ids):
        pos = first_pos + t
        x = ref.embed[tok].clone().requires_grad_(grad)
        for li, lw in enumerate(ref.layers):
            h = _rms_norm(x, lw["ln1"], ref.eps)
            q = ref._rope(pre_rope(ref, li, h, "q"), pos)
            k = ref._rope(pre_rope(ref, li, h, "k"), pos)
            v = F.linear(h, lw["wv"], lw["bv"]).view(ref.Hkv, ref.D)
            heads = []
            for g in range(ref.Hkv):
                own[li][g].append((k[g], v[g]))
                K = torch.stack([pr.k for pr in cache[li][g]] + [kk for kk, _ in own[li][g]])
                V = torch.stack([pr.v for pr in cache[li][g]] + [vv for _, vv in own[li][g]])
                for j in range(ref.G):
                    heads.append(torch.softmax(K @ q[g * ref.G + j] * ref.scale, 0) @ V)
            attn = F.linear(torch.cat(heads), lw["wo"], lw["bo"])
            if attn.requires_grad:
                attn.retain_grad()
            records[li].append((h, q, attn))
            x = x + attn
            h2 = _rms_norm(x, lw["ln2"], ref.eps)
            x = x + F.linear(F.silu(F.linear(h2, lw["gate"])) * F.linear(h2, lw["up"]), lw["down"])
        last.append(x)
    return records, own, last


def cross_attention(ref, cache, li, g, hq, q, t, own, start, end, n_sink) -> list[float]:
    """The weights of pass query t (head hq) on the chunk's pairs [start, end), its softmax over the first
    min(n_sink, start) pairs, the chunk, and the pass's own pairs up to t only."""
    keys = [pr.k for pr in cache[li][g][: min(n_sink, start)]] + [pr.k for pr in cache[li][g][start:end]]
    keys += [kk.detach() for kk, _ in own[li][g][: t + 1]]
    w = torch.softmax(torch.stack(keys) @ q[hq] / math.sqrt(ref.D), 0)
    sink = min(n_sink, start)
    return w[sink : sink + end - start].tolist()


def kvzip_table(ref, cache, tok, context, chunk=2048, n_sink=4, plus=False, grad=False):
    """KVzip's score table [layer][kv_head][pair] (0 where no pass scored: the template's prefix): a chunk's
    pair scores the largest weight any query head of its group and any token of its pass gives it;
    KVzip+ (plus): each weight / ||h of the querying token|| x ||W_O^(hq) v||_2; KVgrad (grad): each weight
    x ||W_O^(hq) v||_2 x ||d Phi / d attention output of the querying token||, Phi = sum over the pass's
    tokens of ||last layer's output||^2."""
    n = len(context)
    table = [[[0.0] * n for _ in range(ref.Hkv)] for _ in ref.layers]
    for start, end, ids in passes(tok, context, chunk):
        with torch.enable_grad():
            records, own, last = replay(ref, cache, ids, n, grad)
            if grad:
                torch.stack([(x**2).sum() for x in last]).sum().backward()
        for li in range(len(ref.layers)):
            for g in range(ref.Hkv):
                best = [0.0] * (end - start)
                for j in range(ref.G):
                    hq = g * ref.G + j
                    wov = [value_out_norm(ref, li, g, pr.v, 2)[j] for pr in cache[li][g][start:end]]
                    for t, (h, q, attn) in enumerate(records[li]):
                        w = cross_attention(ref, cache, li, g, hq, q.detach(), t, own, start, end, n_sink)
                        if plus:
                            w = [x / float(h.norm()) * o for x, o in zip(w, wov, strict=True)]
                        if grad:
                            w = [x * o * float(attn.grad.norm()) for x, o in zip(w, wov, strict=True)]
                        best = [max(b, x) for b, x in zip(best, w, strict=True)]
                table[li][g][start:end] = best
    return table


def duo_head_scores(ref, texts_ids: list[list[int]], q_len: int) -> list[list[float]]:
    """DuoAttention on the fly: per text and layer, the mean over the text of the pre-RoPE query and key;
    the mean query at position q_len - 1 attends (float32 softmax) to the mean key at positions 0..q_len - 1;
    a query head's score is the mean over positions of the cumulated weights; mean over the group; mean
    over the texts. Higher: more of the weight on old positions."""
    out = [[0.0] * ref.Hkv for _ in ref.layers]
    for ids in texts_ids:
        ref.hidden = [[] for _ in ref.layers]
        cache = ref.new_cache()
        for pos, tok in enumerate(ids):
            ref.step(tok, pos, cache)
        for li, seen in enumerate(ref.hidden):
            qm = torch.stack([pre_rope(ref, li, h, "q") for _, h in seen]).mean(0)
            km = torch.stack([pre_rope(ref, li, h, "k") for _, h in seen]).mean(0)
            q = ref._rope(qm, q_len - 1)
            keys = [ref._rope(km, t) for t in range(q_len)]
            for g in range(ref.Hkv):
                s = 0.0
                for j in range(ref.G):
                    logit = torch.stack([k[g] @ q[g * ref.G + j] for k in keys]) / math.sqrt(ref.D)
                    w = torch.softmax(logit.float(), 0)
                    s += float(torch.cumsum(w, 0).mean()) / ref.G
                out[li][g] += s / len(texts_ids)
        ref.hidden = None
    return out

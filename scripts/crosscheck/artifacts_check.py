"""kvbench.artifacts against kvpress 0.5.5, script level (not in the default suite: needs kvpress's venv).

    .venv-kvpress/bin/python scripts/crosscheck/artifacts_check.py kvpress OUT.json [KVZAP_DIR]
    .venv/bin/python         scripts/crosscheck/artifacts_check.py kvbench OUT.json [KVZAP_DIR]

The first writes what kvpress computes: KVzip's `prepare` passes on the tiny character tokenizer's prompts, and
(if KVZAP_DIR is given) `KVzapModel.from_pretrained(KVZAP_DIR)` scores of every layer on seeded random hidden
states. The second recomputes both with kvbench.artifacts and prints whether they are identical.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests import kvpress_tiny as T  # noqa: E402

CASES = [(40, 16), (40, 35), (200, 64), (6, 4), (5, 4)]  # (prompt length, chunk size); 5: an empty context


def hidden(width: int) -> torch.Tensor:
    return torch.randn(2, 7, width, generator=torch.Generator().manual_seed(1))  # (B, T, hidden)


def kvpress_side(kvzap_dir: str | None) -> dict:
    from kvpress.presses.kvzip_press import KVzipPress

    tok, model, out = T.CharTokenizer(), T.tiny_model(), {"kvzip": {}, "kvzap": None}
    for n, chunk in CASES:
        p = KVzipPress(compression_ratio=0.5, chunk_size=chunk)
        p.prefix_length, p._suffix_ids = 5, tok.encode("<|a|>", return_tensors="pt")  # the template's split
        p._context_ids, p.context_length = torch.tensor([T.prompt_ids(n)]), n
        out["kvzip"][f"{n},{chunk}"] = [[a[0].tolist(), r[0].tolist()] for a, r in p.prepare(model, tok)]
    if kvzap_dir:
        from kvpress.presses.kvzap_press import KVzapModel

        m = KVzapModel.from_pretrained(kvzap_dir).eval()
        with torch.no_grad():
            h = hidden(m.config.input_dim)
            out["kvzap"] = [m.layers[li](h).transpose(1, 2).tolist() for li in range(m.config.n_modules)]
    return out


def kvbench_side(kvzap_dir: str | None) -> dict:
    from kvbench.artifacts.kvzap_scorer import load_scorer
    from kvbench.artifacts.kvzip_template import passes

    out = {"kvzip": {}, "kvzap": None}
    for n, chunk in CASES:
        ids = T.prompt_ids(n)
        out["kvzip"][f"{n},{chunk}"] = [[ids[p.start:p.end], p.ids] for p in passes(T.CharTokenizer(), ids, chunk)]
    if kvzap_dir:
        s = load_scorer(kvzap_dir)
        with torch.no_grad():
            h = hidden(s.input_dim)
            out["kvzap"] = [s.score(li, h).tolist() for li in range(s.n_modules)]
    return out


def main() -> None:
    side, path, kvzap_dir = sys.argv[1], Path(sys.argv[2]), (sys.argv[3] if len(sys.argv) > 3 else None)
    if side == "kvpress":
        path.write_text(json.dumps(kvpress_side(kvzap_dir)))
        return
    theirs, ours = json.loads(path.read_text()), kvbench_side(kvzap_dir)
    for key in ("kvzip", "kvzap"):
        print(key, "identical" if theirs[key] == ours[key] else "DIFFERENT")


if __name__ == "__main__":
    main()

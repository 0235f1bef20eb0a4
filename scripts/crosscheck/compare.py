"""The table of `make crosscheck`: kvbench against kvpress 0.5.5, press by press, on the same prompt ids.

Per press, kvbench counterpart and compression ratio: the rows (prompts) whose 64 generated tokens are
identical, the mean share of tokens equal up to the first divergence, the kept prompt positions of every
(layer, KV head) (identical sets, and their Jaccard: mean and least), and ROUGE-2 of each side's summary
against the CNN/DM references (kvbench's scorer). Writes results/crosscheck/table.md, summary.json and
tokens.json.gz (each side's generated tokens, per press and prompt). The table's last column names the notes
listed under it (why rows differ), so its rows stay one line high.

    python scripts/crosscheck/compare.py WORK_DIR OUT_DIR
    python scripts/crosscheck/compare.py --render OUT_DIR   # table.md again from summary.json and tokens.json.gz
"""

from __future__ import annotations

import gzip
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kvbench.tasks.cnndm import CNNDM  # noqa: E402

WHY = {"ties": "kvpress's budget falls among equal scores, where topk's choice is unspecified",
       "near ties": "the differing heads' last kept and first dropped scores are within 1e-4 (relative) on kvpress's "
                    "side, where float32 rounding in another summation order may swap them",
       "same kept pairs (numerics)": "the same kept pairs, other rounding", "rule": "kept pairs differ beyond ties"}


def prefix(a: list[int], b: list[int]) -> float:
    n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return n / max(len(a), len(b))


NEAR = 1e-4  # a relative gap this small is within float32 rounding of scores summed in another order


def kept_stats(a, b, tied, gap) -> tuple[int, int, list[float], str]:
    """(identical (layer, head) sets, their number, Jaccards, the worst reason a set differs) of two rows'
    kept[layer][head] position lists. `tied[layer][head]`: kvpress's budget boundary fell among equal scores;
    `gap[layer][head]`: the relative gap there (None: not recorded). The reason is "ties" when every differing
    set was tied on kvpress's side, "near ties" when every one was tied or within NEAR, else "rule"."""
    same, total, jac, worst = 0, 0, [], "ties"
    for li, (la, lb) in enumerate(zip(a, b, strict=True)):
        for hi, (ha, hb) in enumerate(zip(la, lb, strict=True)):
            sa, sb = set(ha), set(hb)
            total += 1
            same += sa == sb
            if sa != sb and not (tied and tied[li][hi]):
                near = gap is not None and gap[li][hi] < NEAR
                worst = "rule" if not near or worst == "rule" else "near ties"
            jac.append(len(sa & sb) / len(sa | sb) if sa | sb else 1.0)
    return same, total, jac, worst


def explain(row_sets_same: bool, worst: str) -> str:
    """Why a row's tokens diverge: kvpress chose among (nearly) equal scores, or the same pairs with other
    numerics, or the rules differ."""
    return "same kept pairs (numerics)" if row_sets_same else worst


def main() -> None:
    work, out = Path(sys.argv[1]), Path(sys.argv[2])
    import torch
    import transformers
    from kvbench_side import load  # this folder: the model both sides ran

    tok = load().tokenizer
    spec = json.loads((work / "ids.json").read_text())
    task = CNNDM(n_samples=1, n_shot=0, data_dir=None)

    def r2(tokens, refs) -> float:
        return task.score(task.extract(task.cut_at_stop(tok.decode(tokens, skip_special_tokens=True))), refs)["rouge2"]

    versions = json.loads((work / "kvpress" / "versions.json").read_text())
    rows, tokens = [], {}
    for path in sorted((work / "kvbench").glob("*.json")):
        kb = json.loads(path.read_text())
        kp = json.loads((work / "kvpress" / f"{kb['press']}-{kb['ratio']}.json").read_text())
        same_tokens, prefixes, same_sets, sets, jac = 0, [], 0, 0, []
        diverged = {}  # row -> why: ties | same kept pairs (numerics) | rule
        for i, (a, b) in enumerate(zip(kb["rows"], kp["rows"], strict=True)):
            same_tokens += a["tokens"] == b["tokens"]
            prefixes.append(prefix(a["tokens"], b["tokens"]))
            s, t, j, worst = kept_stats(a["kept"], b["kept"], b.get("tied"), b.get("gap"))
            same_sets, sets, jac = same_sets + s, sets + t, jac + j
            if a["tokens"] != b["tokens"]:
                diverged[i] = explain(s == t, worst)
        refs = spec["references"]
        tokens[f"{kb['label']} {kb['ratio']:g}"] = {"kvbench": [r["tokens"] for r in kb["rows"]],
                                                   "kvpress": [r["tokens"] for r in kp["rows"]]}
        rows.append({
            "press": kb["press"], "kvbench": kb["label"], "ratio": kb["ratio"], "why": kb["why"],
            "identical_rows": same_tokens, "rows": len(kb["rows"]), "diverged_rows": diverged,
            "rows_identical_or_ties": same_tokens + sum(why in ("ties", "near ties") for why in diverged.values()),
            "mean_common_prefix": round(statistics.fmean(prefixes), 4),
            "identical_sets": same_sets, "sets": sets, "jaccard_mean": round(statistics.fmean(jac), 4),
            "jaccard_min": round(min(jac), 4),
            "rouge2_kvbench": round(statistics.fmean(r2(r["tokens"], f) for r, f in zip(kb["rows"], refs, strict=True)), 4),
            "rouge2_kvpress": round(statistics.fmean(r2(r["tokens"], f) for r, f in zip(kp["rows"], refs, strict=True)), 4),
        })
    rows.sort(key=lambda r: (r["press"] != "none", r["press"], r["ratio"], r["kvbench"]))  # the control first
    out.mkdir(parents=True, exist_ok=True)
    lengths = [len(x) for x in spec["ids"]]
    versions = {"kvpress_side": versions, "kvbench_side": {"transformers": transformers.__version__,
                                                           "torch": torch.__version__}}
    summary = {"versions": versions, "prompt_tokens": lengths, "rows": rows}
    text = render(summary, spec["new_tokens"])
    (out / "table.md").write_text(text)
    with gzip.GzipFile(out / "tokens.json.gz", "wb", mtime=0) as f:  # both sides' generated tokens (reproducible)
        f.write(json.dumps(tokens).encode())
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(text)


def notes_of(r: dict) -> list[str]:
    """Why a press's rows differ: its rule's difference on purpose, then the diverging rows by reason."""
    by_why: dict[str, list] = {}
    for i, why in r["diverged_rows"].items():
        by_why.setdefault(why, []).append(i)
    if r["why"]:  # a different rule on purpose: its rows need no other reason
        by_why.pop("rule", None)
    rows = [f"{'rows' if len(ids) > 1 else 'row'} {', '.join(map(str, ids))}: {WHY[why]}" for why, ids in by_why.items()]
    return [r["why"]] * bool(r["why"]) + rows


def breakable(name: str) -> str:
    """A press or policy name the browser may break after its underscores (`<wbr>`: nothing is copied with it)."""
    return name.replace("_", "_<wbr>")


def render(summary: dict, new_tokens: int) -> str:
    """table.md: the setting, one row per press, kvbench counterpart and ratio, then the notes the rows name."""
    lengths, kp, kb = summary["prompt_tokens"], summary["versions"]["kvpress_side"], summary["versions"]["kvbench_side"]
    head = [
        "# kvbench against kvpress, token for token",
        "",
        f"SmolLM2-135M-Instruct (Q4_1 GGUF dequantised to float32), the first {len(lengths)} CNN/DM test articles "
        f"0-shot ({min(lengths)}-{max(lengths)} prompt tokens, the same token ids on both sides), batch 1, "
        f"{new_tokens} new tokens with EOS ignored, the prompt compressed once after prefill "
        "(kvbench: `policy.schedule=after_prefill policy.compression_ratio=r`). kvpress "
        f"{kp['kvpress']}, transformers {kp['transformers']} (its venv), torch {kp['torch']}; "
        f"kvbench with transformers {kb['transformers']}, torch {kb['torch']}. Made by `make crosscheck`.",
        "",
        "| kvpress press | kvbench | ratio | rows with identical tokens | mean common prefix | (layer, head) kept "
        "sets identical | kept-set Jaccard mean / least | ROUGE-2 kvbench / kvpress | notes |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    notes: list[str] = []  # each note once, numbered in the order the rows first name it
    for r in summary["rows"]:
        refs = []
        for n in notes_of(r):
            notes += [n] * (n not in notes)
            refs.append(str(notes.index(n) + 1))
        extra = r["rows_identical_or_ties"] - r["identical_rows"]
        ties = f" (+{extra} at ties)" if extra else ""
        ratio = "-" if r["press"] == "none" else f"{r['ratio']:g}"
        head.append(f"| {breakable(r['press'])} | {breakable(r['kvbench'])} | {ratio} | {r['identical_rows']}/{r['rows']}{ties} | "
                    f"{r['mean_common_prefix']:.3f} | {r['identical_sets']}/{r['sets']} | {r['jaccard_mean']:.4f} / "
                    f"{r['jaccard_min']:.4f} | {r['rouge2_kvbench']:.4f} / {r['rouge2_kvpress']:.4f} | "
                    f"{', '.join(refs)} |")
    return "\n".join([*head, "", "Notes:", "", *(f"{i}. {n}" for i, n in enumerate(notes, 1))]) + "\n"


def rerender(out: Path) -> None:
    """table.md again from the committed summary.json and tokens.json.gz (no kvpress, no model)."""
    summary = json.loads((out / "summary.json").read_text())
    with gzip.open(out / "tokens.json.gz", "rt") as f:
        new_tokens = {len(t) for side in json.load(f).values() for rows in side.values() for t in rows}
    assert len(new_tokens) == 1, new_tokens
    (out / "table.md").write_text(render(summary, new_tokens.pop()))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--render"]:
        rerender(Path(sys.argv[2]))
    else:
        main()

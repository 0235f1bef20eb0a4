"""From generated tokens to the run's scores: the same for static runs and serve mode.

`predictions` cuts each generation at EOS and the task's stop strings, lets the task extract the answer
and score it (lm-evaluation-harness style: extraction apart from the metric), and summarises the
metrics with their bootstrap intervals and the output lengths; `score_rows` is the small per-run scores
file; `prompt_stats` the record's prompt-length summary.
"""

from __future__ import annotations

import statistics

from kvbench import stats


def prompt_stats(samples, ids) -> dict:
    lengths = [len(x) for x in ids]
    return {
        "n": len(lengths),
        "tokens_mean": round(statistics.fmean(lengths), 1),
        "tokens_median": statistics.median(lengths),
        "tokens_min": min(lengths),
        "tokens_max": max(lengths),
        "n_cut": sum(1 for s in samples if s.truncated),
    }


def predictions(task, samples, ids, token_ids: list[list[int]], lm, save_prompt_ids: bool):
    """Cut each generation (`token_ids`, one list per sample) at EOS and the task's stop strings, extract, score.

    Returns the rows, the metrics (means and their `<metric>_ci` bootstrap intervals, kvbench.stats)
    and the output-length summary (tokens before the first EOS / stop string, also with ignore_eos).
    """
    rows, scores, lengths = [], [], []
    eos = set(lm.eos_token_ids)

    def text_of(gen: list[int]) -> str:
        return task.cut_at_stop(lm.tokenizer.decode(gen, skip_special_tokens=True))

    for s, p_ids, gen in zip(samples, ids, token_ids, strict=True):
        upto = next((i for i, t in enumerate(gen) if t in eos), len(gen))
        text = text_of(gen[:upto])
        score = task.score(task.extract(text), s.references)
        scores.append(score)
        n_out = stats.output_length(gen, eos, text_of if task.stop_strings else None)
        lengths.append(n_out)
        row = {
            "index": s.index,
            "prompt": s.prompt,
            "prompt_tokens": len(p_ids),
            "prediction": text,
            "references": s.references,
            "token_ids": gen,
            "score": score,
            "output_tokens": n_out,
        }
        if save_prompt_ids:
            row["prompt_ids"] = p_ids
        rows.append(row)
    by_index = [r["score"] for r in sorted(rows, key=lambda r: r["index"])]  # intervals never depend on order
    metrics = {**task.aggregate(scores), **stats.metric_intervals(by_index)}
    return rows, metrics, stats.length_summary(lengths)


def score_rows(rows: list[dict]) -> list[dict]:
    """The small per-run scores file (index, score, output length): what the report's intervals need."""
    return [{"index": r["index"], "score": r["score"], "output_tokens": r.get("output_tokens")} for r in rows]

"""kvbench-report with per-sample data: intervals, paired differences to FKV, agreement and lengths,
checked against direct computations on known per-sample scores and token sequences; the intervals
are rebuilt from the small scores files alone when the predictions are gone."""

import numpy as np
import pytest

from kvbench import report, stats
from kvbench.results import append_record, write_jsonl

N = 12
RNG = np.random.default_rng(3)
HARD = RNG.uniform(0.0, 0.3, size=N)  # per-sample difficulty, shared by every run
FKV_SCORES = HARD + 0.05
SCORES = {
    "fkv": FKV_SCORES,
    "bm128": FKV_SCORES - 0.04 + RNG.normal(0, 0.003, size=N),  # clearly below FKV
    "bm256": FKV_SCORES + RNG.normal(0, 0.01, size=N),  # noise around FKV
    "ed": np.zeros(N),
}
REF_IDS = [[i, 1, 2, 3, 4, 5, 6, 7] for i in range(N)]
TOKENS = {
    "fkv": REF_IDS,
    "bm128": [ids[:2] + [99] * 6 for ids in REF_IDS],  # diverges at token 2: 2/8
    "bm256": [ids if i % 2 else ids[:6] + [99, 99] for i, ids in enumerate(REF_IDS)],  # 1 or 6/8; half identical
    "ed": [[99] * 8 for _ in REF_IDS],
}
LENGTHS = {"fkv": 8, "bm128": 5, "bm256": 8, "ed": 3}
RUNS = {  # run_id -> policy, kv, b, tokens/s
    "fkv": ("full", None, 4, 30.0),
    "bm128": ("batch_max", 128, 12, 60.0),
    "bm256": ("batch_max", 256, 8, 50.0),
    "ed": ("extreme_decode", 2, 4, 40.0),
}


def direct_mean_ci(values):
    idx = stats.resample_indices(len(values))
    means = np.array([np.mean([values[j] for j in row]) for row in idx])
    return float(np.mean(values)), tuple(np.quantile(means, [0.025, 0.975]))


def _write(tmp_path, with_ci=True, drop_predictions=()):
    indices = list(range(100, 100 + N))  # dataset rows, not positions
    for run_id, (policy, kv, b, tok) in RUNS.items():
        order = indices if run_id != "bm256" else indices[::-1]  # files need not be in the same order
        rows = [{"index": i, "score": {"rouge2": float(SCORES[run_id][i - 100])},
                 "token_ids": TOKENS[run_id][i - 100], "output_tokens": LENGTHS[run_id]} for i in order]
        pred, scores = tmp_path / "predictions" / f"{run_id}.jsonl", tmp_path / "scores" / f"{run_id}.jsonl"
        write_jsonl(scores, [{k: r[k] for k in ("index", "score", "output_tokens")} for r in rows])
        if run_id not in drop_predictions:
            write_jsonl(pred, rows)
        metrics = {"rouge2": float(np.mean(SCORES[run_id]))}
        if with_ci:
            metrics |= stats.metric_intervals([r["score"] for r in sorted(rows, key=lambda r: r["index"])])
        append_record(tmp_path, {
            "run_id": run_id, "config_hash": run_id, "status": "ok", "model": "m", "task": "cnndm",
            "policy": policy, "kv_size": kv, "schedule": None if policy == "full" else "prefill_and_decode",
            "batch_size": b, "n_samples": N, "max_new_tokens": 8, "metrics": metrics, "throughput_tok_s": tok,
            "output_tokens": stats.length_summary([LENGTHS[run_id]] * N) if with_ci else None,
            "predictions_path": f"elsewhere/predictions/{run_id}.jsonl",  # as recorded from another directory
        })
    return tmp_path


def test_intervals_paired_differences_and_agreement(tmp_path):
    report.main([str(_write(tmp_path))])
    text = (tmp_path / "tables.md").read_text()
    for run_id in RUNS:  # every metric cell carries its interval
        mean, (lo, hi) = direct_mean_ci(list(SCORES[run_id]))
        assert f"{mean:.3f} [{lo:.3f}, {hi:.3f}]" in text
    d128 = list(SCORES["bm128"] - SCORES["fkv"])
    mean, (lo, hi) = direct_mean_ci(d128)
    assert hi < 0  # the fixture's claim: clearly below
    cell = f"{mean:+.3f} [{lo:+.3f}, {hi:+.3f}]"
    assert f"| BM | 12 | 128 | {cell} | 0.25 [0.25, 0.25] | 0.00 [0.00, 0.00] | 5.0 / 5 / 5 |" in text
    mean, (lo, hi) = direct_mean_ci(list(SCORES["bm256"] - SCORES["fkv"]))
    assert lo < 0 < hi
    p_mean, (p_lo, p_hi) = direct_mean_ci([1.0 if i % 2 else 0.75 for i in range(N)])
    e_mean, (e_lo, e_hi) = direct_mean_ci([1.0 if i % 2 else 0.0 for i in range(N)])
    assert (f"| BM | 8 | 256 | {mean:+.3f} [{lo:+.3f}, {hi:+.3f}] | {p_mean:.2f} [{p_lo:.2f}, {p_hi:.2f}] "
            f"| {e_mean:.2f} [{e_lo:.2f}, {e_hi:.2f}] | 8.0 / 8 / 8 |") in text
    assert "| FKV | 4 | - | reference | reference | reference | 8.0 / 8 / 8 |" in text
    # the paper's picks keep the paper's rule (bm256 reaches FKV's mean or not by chance); next to them the verdict
    assert "| vs FKV (paired, 95% CI) |" in text and "| FKV | 4 | - |" in text
    assert ": indistinguishable from FKV |" in text or ": above FKV |" in text
    assert "Against FKV (the FKV run above, b=4; paired by sample, 12 samples" in text
    assert (tmp_path / "plots" / "m_cnndm_n12_new8_agreement_vs_kv.png").read_bytes()[:4] == b"\x89PNG"
    assert "agreement_vs_kv.png" in text


def test_intervals_rebuilt_from_scores_files_alone(tmp_path):
    """Old records (no `_ci`, no lengths) and no predictions: the scores files give the same intervals."""
    with_all = tmp_path / "a"
    report.main([str(_write(with_all)), "--no-plots"])
    alone = tmp_path / "b"
    report.main([str(_write(alone, with_ci=False, drop_predictions=tuple(RUNS))), "--no-plots"])
    full_text, scores_text = (with_all / "tables.md").read_text(), (alone / "tables.md").read_text()
    d128 = direct_mean_ci(list(SCORES["bm128"] - SCORES["fkv"]))
    assert f"| BM | 12 | 128 | {d128[0]:+.3f} [{d128[1][0]:+.3f}, {d128[1][1]:+.3f}] | - | - | 5.0 / 5 / 5 |" in scores_text
    # everything but the token agreement (which needs the generated ids) is the same
    strip = [ln.rsplit("|", 4)[0] for ln in full_text.splitlines() if ln.startswith("| BM | 12 | 128")]
    assert strip == [ln.rsplit("|", 4)[0] for ln in scores_text.splitlines() if ln.startswith("| BM | 12 | 128")]


def test_no_per_sample_data_leaves_the_tables_as_they_were(tmp_path):
    _write(tmp_path, with_ci=False, drop_predictions=tuple(RUNS))
    for d in ("scores",):
        for f in (tmp_path / d).iterdir():
            f.unlink()
    report.main([str(tmp_path), "--no-plots"])
    text = (tmp_path / "tables.md").read_text()
    assert "vs FKV" not in text and "Against FKV" not in text and "[" not in text.split("All runs")[1]


@pytest.mark.parametrize("ci", [None, (0.051, 0.078)])
def test_metric_cell(ci):
    row = report.Row("BM", 12, 1024, 0.0644, 10.4, ci=ci)
    assert row.cells()[3] == ("0.064" if ci is None else "0.064 [0.051, 0.078]")
    assert row == report.Row("BM", 12, 1024, 0.0644, 10.4)  # intervals do not change a row's identity

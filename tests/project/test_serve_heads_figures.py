"""docs/serving-heads.md's figures, recomputed from the committed benchmark line (results/serve_heads/bench.jsonl,
written by scripts/bench_serve_heads.py) and its records (results/serve_heads/runs.jsonl)."""

from __future__ import annotations

from tests.project.test_docs_figures import lines, row, states

DOC = "docs/serving-heads.md"
NAMES = {"cnndm": "CNN/DM", "passkey": "passkey"}


def test_serve_heads_table_and_ratios():
    line = lines("results/serve_heads/bench.jsonl")[-1]
    runs = {r["run_id"]: r for r in lines("results/serve_heads/runs.jsonl")}
    assert line["provenance"]["command"].startswith("python scripts/bench_serve_heads.py")
    for task, got in line["tasks"].items():
        for variant in ("uniform", "adaptive"):
            v = got[variant]
            rec = runs[v["run_id"]]  # the line's figures are its records'
            assert rec["metrics"][got["metric"]] == v["accuracy"] and rec["peak_kv_bytes"] == v["peak_kv_bytes"]
            assert rec["serve"]["output_tok_s"] == v["output_tok_s"]
            assert (rec["config"]["policy"].get("head_budget", "uniform")) == variant
            states(DOC, row(NAMES[task], variant, f"{v['accuracy']:.3f}", f"{v['running_mean']:.2f} / {v['running_max']}",
                            f"{v['output_tok_s']:.3f}", f"{v['peak_kv_bytes'] / 2**20:.2f}", v["evicted_blocks"],
                            v["preemptions"]))
        r = got["adaptive_over_uniform"]
        states(DOC, f"{NAMES[task]}: peak KV x{r['peak_kv_bytes']:.3f}, requests at once x{r['running_mean']:.2f}, "
                    f"output tokens/s x{r['output_tok_s']:.2f}")
    c, p = (1 - line["tasks"][t]["adaptive_over_uniform"]["peak_kv_bytes"] for t in ("cnndm", "passkey"))
    prov = line["provenance"]
    states(DOC, f"({100 * c:.1f}% less than uniform on CNN/DM and {100 * p:.1f}% less on passkey here)",
           f"load average {prov['load_avg_1m_before']:.1f} before and {prov['load_avg_1m_after']:.1f} after")

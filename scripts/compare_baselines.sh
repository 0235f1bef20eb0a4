#!/usr/bin/env bash
# The baselines on this CPU (SmolLM2-135M, passkey, batch 8): small on purpose (a shared 2-core machine).
# Runs in priority order; each run appends one record to results/baselines/runs.jsonl, so an
# interrupted comparison keeps what finished. Table: python scripts/baselines_table.py
set -u
cd "$(dirname "$0")/.."
PY=${PY:-python}
COMMON="task=passkey task.n_samples=8 task.context_tokens=384 gen.max_new_tokens=8 batch_size=8 results_dir=results/baselines"
KV=${KV:-128}
run() { $PY -m kvbench $COMMON "$@" 2>&1 | grep '^kvbench:' ; }
run policy=full
for pol in snapkv knorm keydiff random batch_max streaming_llm; do
  run policy=$pol policy.kv_size=$KV policy.evict_every=32 policy.schedule=prefill_and_decode
done
for pol in h2o tova; do  # published p = 1; block-wise here so prefill eviction stays affordable on a CPU
  run policy=$pol policy.kv_size=$KV policy.evict_every=32 policy.schedule=prefill_and_decode
done
for pol in snapkv knorm batch_max; do
  run policy=$pol policy.kv_size=$KV policy.evict_every=32 policy.schedule=decode_only
done
for pol in streaming_llm batch_max; do  # with and without RoPE re-rotation
  run policy=$pol policy.kv_size=$KV policy.evict_every=32 policy.schedule=prefill_and_decode policy.rerotate=true
done

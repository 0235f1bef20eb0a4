#!/usr/bin/env bash
# The baselines on this CPU (SmolLM2-135M, passkey, batch 8): small on purpose (a shared 2-core machine).
# Runs in priority order; each run appends one record to results/baselines/runs.jsonl, so an
# interrupted comparison keeps what finished, and a rerun skips what is there (skip_existing=true).
# Table: python scripts/baselines_table.py
set -u
cd "$(dirname "$0")/.."
PY=${PY:-python}
KV=${KV:-128}
COMMON="task=passkey task.n_samples=8 task.context_tokens=384 gen.max_new_tokens=8 batch_size=8 skip_existing=true results_dir=results/baselines"
EV="policy.kv_size=$KV policy.evict_every=32"  # block-wise everywhere (h2o/tova publish p = 1: too slow in prefill here)
run() { $PY -m kvbench $COMMON "$@" 2>&1 | tr '\r' '\n' | grep '^kvbench:' ; }
run policy=full
run policy=snapkv $EV policy.schedule=prefill_and_decode
run policy=snapkv $EV policy.schedule=decode_only
run policy=knorm $EV policy.schedule=prefill_and_decode
run policy=knorm $EV policy.schedule=decode_only
run policy=batch_max $EV policy.schedule=prefill_and_decode
run policy=streaming_llm $EV policy.schedule=prefill_and_decode
run policy=streaming_llm $EV policy.schedule=prefill_and_decode policy.rerotate=true
run policy=batch_max $EV policy.schedule=prefill_and_decode policy.rerotate=true
for pol in keydiff random tova h2o; do
  run policy=$pol $EV policy.schedule=prefill_and_decode
done
for pol in keydiff random tova h2o batch_max; do
  run policy=$pol $EV policy.schedule=decode_only
done

#!/usr/bin/env bash
# RULER niah_single_1 on this CPU (2 cores shared with other jobs, run at nice 10): SmolLM2-135M (the default
# model), 4 samples, batch 4, at 1k tokens (then 2k if time allows): full cache, then window / StreamingLLM /
# H2O / TOVA / SnapKV / Batch-Max at kvpress's compression ratio 0.75 under prefill_and_decode, every policy
# with evict_every=64; SnapKV under kvpress's protocol (after_prefill) query-aware and query-agnostic; a small
# needle heatmap (kvbench-needle); then decode_only, ratio 0.5 and 2k tokens, in that order. Decoding is capped at 16 tokens (the answer, a 7-digit number, follows
# the prefilled answer prefix; RULER allows 128). Priority order: each run appends one record to
# results/ruler_cpu/runs.jsonl, so a cut-short run keeps what finished and a rerun skips what is there.
# Tables: kvbench-report results/ruler_cpu ; docs/long-context.md reads them.
set -u
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
PY=$BIN/python
OUT=${OUT:-results/ruler_cpu}
POLICIES=window,streaming_llm,h2o,tova,snapkv,batch_max
COMMON="task=niah_single_1 task.n_samples=4 batch_size=4 gen.max_new_tokens=16 skip_existing=true results_dir=$OUT"
run() { "$@" 2>&1 | tr '\r' '\n' | grep -E '^kvbench|Error|error:' ; }
run $BIN/kvbench $COMMON task.context_length=1024 policy=full
run $BIN/kvbench -m $COMMON task.context_length=1024 policy=$POLICIES policy.compression_ratio=0.75 \
  policy.evict_every=64 policy.schedule=prefill_and_decode
run $BIN/kvbench -m $COMMON task.context_length=1024 policy=snapkv policy.schedule=after_prefill \
  policy.compression_ratio=0.75 task.query_aware=true,false
run $BIN/kvbench-needle --lengths 512,1024 --depths 0,0.5,1 --policy full \
  --policy "streaming_llm policy.compression_ratio=0.75 policy.evict_every=64" \
  task.n_samples=2 batch_size=2 gen.max_new_tokens=16 results_dir=results/needle_cpu
run $BIN/kvbench -m $COMMON task.context_length=1024 policy=$POLICIES policy.compression_ratio=0.75 \
  policy.evict_every=64 policy.schedule=decode_only
run $BIN/kvbench -m $COMMON task.context_length=1024 policy=$POLICIES policy.compression_ratio=0.5 \
  policy.evict_every=64 policy.schedule=prefill_and_decode,decode_only
run $BIN/kvbench $COMMON task.context_length=2048 policy=full
run $BIN/kvbench -m $COMMON task.context_length=2048 policy=$POLICIES policy.compression_ratio=0.75 \
  policy.evict_every=64 policy.schedule=prefill_and_decode,decode_only
$PY scripts/ruler_table.py $OUT
$BIN/kvbench-report $OUT

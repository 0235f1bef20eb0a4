#!/usr/bin/env bash
# RULER niah_single_1 on this CPU, as committed in results/ruler_cpu and results/needle_cpu: SmolLM2-135M (the
# default model), 1k-token contexts, 4 samples at batch 4 (needle: 2 at batch 2), every run at nice 10 on 2 cores
# shared with four other jobs (load average 10-13: tokens/s here measure contention, not the policies).
# Decoding is capped at 16 tokens (the answer, a 7-digit number, follows the prefilled answer prefix; RULER
# allows 128). Each run appends one record (skip_existing=true: a rerun skips what is there).
#   1. the full cache;
#   2. window / StreamingLLM / H2O / TOVA / SnapKV / Batch-Max at kvpress's compression ratio 0.75 under
#      prefill_and_decode, evict_every=64 (the multirun was stopped after H2O for lack of time: TOVA and SnapKV
#      under it were not run; Batch-Max ran on its own, step 4);
#   3. SnapKV under kvpress's protocol (after_prefill, ratio 0.75), query-aware and query-agnostic;
#   4. Batch-Max at ratio 0.75 under prefill_and_decode;
#   5. the needle heatmap: depths 0 / 0.5 / 1 x 512 / 1024 tokens, full cache and StreamingLLM at ratio 0.75.
# The steps after 5 (decode_only, ratio 0.5, 2k tokens) were planned and not run: set RUN_ALL=1 to run them.
# Then: python scripts/ruler_table.py (results/ruler_cpu/table.md) and kvbench-report results/ruler_cpu.
set -u
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
OUT=${OUT:-results/ruler_cpu}
POLICIES=window,streaming_llm,h2o,tova,snapkv,batch_max
COMMON="task=niah_single_1 task.n_samples=4 batch_size=4 gen.max_new_tokens=16 skip_existing=true results_dir=$OUT"
run() { "$@" 2>&1 | tr '\r' '\n' | grep -E '^kvbench|Error|error:' ; }
run $BIN/kvbench $COMMON task.context_length=1024 policy=full
run $BIN/kvbench -m $COMMON task.context_length=1024 policy=$POLICIES policy.compression_ratio=0.75 \
  policy.evict_every=64 policy.schedule=prefill_and_decode
run $BIN/kvbench -m $COMMON task.context_length=1024 policy=snapkv policy.schedule=after_prefill \
  policy.compression_ratio=0.75 task.query_aware=true,false
run $BIN/kvbench $COMMON task.context_length=1024 policy=batch_max policy.compression_ratio=0.75 \
  policy.evict_every=64 policy.schedule=prefill_and_decode
run $BIN/kvbench-needle --lengths 512,1024 --depths 0,0.5,1 --policy full \
  --policy "streaming_llm policy.compression_ratio=0.75 policy.evict_every=64" \
  task.n_samples=2 batch_size=2 gen.max_new_tokens=16 results_dir=results/needle_cpu
if [ "${RUN_ALL:-0}" = 1 ]; then
  run $BIN/kvbench -m $COMMON task.context_length=1024 policy=$POLICIES policy.compression_ratio=0.75 \
    policy.evict_every=64 policy.schedule=decode_only
  run $BIN/kvbench -m $COMMON task.context_length=1024 policy=$POLICIES policy.compression_ratio=0.5 \
    policy.evict_every=64 policy.schedule=prefill_and_decode,decode_only
  run $BIN/kvbench $COMMON task.context_length=2048 policy=full
  run $BIN/kvbench -m $COMMON task.context_length=2048 policy=$POLICIES policy.compression_ratio=0.75 \
    policy.evict_every=64 policy.schedule=prefill_and_decode,decode_only
fi
$BIN/python scripts/ruler_table.py "$OUT"
$BIN/kvbench-report "$OUT"

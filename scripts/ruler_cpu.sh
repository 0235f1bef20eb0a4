#!/usr/bin/env bash
# RULER on this CPU, as committed in results/ruler_cpu: SmolLM2-135M (the default model), RULER's own generation
# lengths (gen.max_new_tokens left null: 128 new tokens at most for the niah tasks, stopping at EOS), 4 samples at
# batch 4, on 2 cores shared with other jobs (tokens/s here measure contention, not the policies).
# Each run appends one record (skip_existing=true: a rerun skips what is there), in this order:
#   1. niah_single_1 (RULER's noise haystack) at 1k tokens: the full cache, StreamingLLM at compression ratio
#      0.75 under prefill_and_decode (evict_every=64), SnapKV at ratio 0.75 under kvpress's protocol
#      (after_prefill, query-agnostic);
#   2. niah_single_3 (UUID values) at 1k tokens, full cache, on CNN/DailyMail articles (task.haystack=cnndm: Paul
#      Graham's essays cannot be downloaded on this machine; the record says so), from the mirror in $DATA_DIR:
#      RULER's 128 new tokens, then capped at 32 (kvbench's former default) and 48; and on RULER's noise haystack
#      (task.haystack=noise), 128 new tokens;
#   3. the same three policies as 1 on niah_single_1 at 2k tokens.
# Then: python scripts/ruler_table.py (results/ruler_cpu/table.md) and kvbench-report results/ruler_cpu.
set -u
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
OUT=${OUT:-results/ruler_cpu}
DATA_DIR=${DATA_DIR:-../shared/data}
COMMON="task.n_samples=4 batch_size=4 skip_existing=true results_dir=$OUT"
STREAM="policy=streaming_llm policy.compression_ratio=0.75 policy.evict_every=64 policy.schedule=prefill_and_decode"
SNAP="policy=snapkv policy.compression_ratio=0.75 policy.schedule=after_prefill task.query_aware=false"
run() { "$@" 2>&1 | tr '\r' '\n' | grep -E '^kvbench|Error|error:' ; }
for length in 1024 2048; do
  run $BIN/kvbench task=niah_single_1 task.context_length=$length $COMMON policy=full
  run $BIN/kvbench task=niah_single_1 task.context_length=$length $COMMON $STREAM
  run $BIN/kvbench task=niah_single_1 task.context_length=$length $COMMON $SNAP
  if [ "$length" = 1024 ]; then
    for cap in null 32 48; do
      run $BIN/kvbench task=niah_single_3 task.context_length=1024 task.haystack=cnndm data.dir=$DATA_DIR $COMMON \
        policy=full gen.max_new_tokens=$cap
    done
    run $BIN/kvbench task=niah_single_3 task.context_length=1024 task.haystack=noise $COMMON policy=full
  fi
done
$BIN/python scripts/ruler_table.py "$OUT"
$BIN/kvbench-report "$OUT"

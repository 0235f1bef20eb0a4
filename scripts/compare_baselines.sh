#!/usr/bin/env bash
# Every policy on this CPU: SmolLM2-135M, batch 8, 8 samples per task, kv 128 and 256 (p = 32 for every
# policy), scored policies under both schedules, passkey / CNN/DM / NarrativeQA (0-shot, inputs cut at
# 512 tokens so that a kv size is a real share of the prompt), plus re-rotation on and off.
# Runs in priority order (kv 128 on every task first); each run appends one record to
# results/baselines/runs.jsonl, so an interrupted comparison keeps what finished, and a rerun skips what is
# there (skip_existing=true). Tables and plots: python scripts/baselines_table.py
set -u
cd "$(dirname "$0")/.."
KVBENCH=${KVBENCH:-.venv/bin/kvbench}
OUT=${OUT:-results/baselines}
SCORED=batch_max,h2o,tova,snapkv,pyramidkv,knorm,keydiff,random
COMMON="batch_size=8 task.n_samples=8 skip_existing=true results_dir=$OUT data.dir=${DATA_DIR:-../shared/data}"
declare -A TASK=(
  [passkey]="task=passkey task.context_tokens=384 gen.max_new_tokens=8"
  [cnndm]="task=cnndm task.n_shot=0 task.max_input_tokens=512 gen.max_new_tokens=32"
  [narrativeqa]="task=narrativeqa task.n_shot=0 task.max_input_tokens=512 gen.max_new_tokens=16"
)
run() { $KVBENCH "$@" 2>&1 | tr '\r' '\n' | grep -E '^kvbench:|Error|error:' ; }
for kv in 128 256; do
  for t in passkey cnndm narrativeqa; do
    T="$COMMON ${TASK[$t]}"
    if [ "$kv" = 128 ]; then
      run $T policy=full
      run $T policy=extreme_decode
    fi
    run -m $T policy=window,streaming_llm policy.kv_size=$kv policy.evict_every=32
    run -m $T policy=$SCORED policy.schedule=prefill_and_decode,decode_only policy.kv_size=$kv policy.evict_every=32
    if [ "$kv" = 128 ] && [ "$t" != narrativeqa ]; then
      run -m $T policy=streaming_llm,batch_max policy.kv_size=$kv policy.evict_every=32 policy.rerotate=true
    fi
  done
done

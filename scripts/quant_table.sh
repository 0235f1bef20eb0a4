#!/usr/bin/env bash
# Quantized KV with eviction on this CPU: the full cache, Batch-Max and SnapKV at gen.kv_cache_dtype=auto (the
# model's dtype, float32 on the CPU), int8 and int4, on CNN/DM (1-shot, ROUGE) and passkey, each at its largest
# batch under one accounted memory limit (experiment=mini_quant_cnndm: 0.69 GiB, search.max_batch=true, the search
# decided by the account), 24 samples, prompts cut at 2,048 tokens (passkey: 1,536 context tokens), 64 new
# tokens, one torch thread (OMP_NUM_THREADS=1: two threads on shared cores mostly wait on each other). Each run appends one record to $OUT/runs.jsonl
# (skip_existing=true: a rerun skips what is there): accuracy with its bootstrap interval, the batch found and the
# first out-of-memory one, tokens/s, peak KV. Then: kvbench-report $OUT.
# TASKS=cnndm / TASKS=passkey runs one task (two such processes share the cores).
# On 2 shared cores tokens/s measure contention and the CPU's dequantisation, not a GPU's kernels.
set -u
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
OUT=${OUT:-results/mini_quant}
DATA_DIR=${DATA_DIR:-../shared/data}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
run() { "$@" 2>&1 | tr '\r' '\n' | grep -E '^kvbench|Error|error:' ; }
for task in ${TASKS:-cnndm passkey}; do
  for policy in full batch_max snapkv; do
    for dtype in auto int8 int4; do
      kv=$([ "$policy" = full ] && echo policy.kv_size=null || echo policy.kv_size=256)
      extra=$([ "$task" = passkey ] && echo task.context_tokens=1536 || true)
      run $BIN/kvbench experiment=mini_quant_cnndm task=$task policy=$policy $kv $extra \
        gen.kv_cache_dtype=$dtype search.max_batch=true data.dir=$DATA_DIR skip_existing=true results_dir=$OUT
    done
  done
done
# The same question with the model in bfloat16 (a GPU's usual dtype), planned without weights: Batch-Max's largest
# batch at an accounted 0.37 GiB (weights 0.25 GiB) with the cache at 16 bits, int8 and int4 -> $OUT/plan_bf16.jsonl
for dtype in auto int8 int4; do
  $BIN/kvbench-plan experiment=mini_quant_cnndm model.dtype=bfloat16 memory.limit_gb=0.37 gen.kv_cache_dtype=$dtype \
    data.dir=$DATA_DIR 2>/dev/null | sed -n 's/^kvbench-plan: {/{/p' | $BIN/python -c \
    "import json, sys; r = json.load(sys.stdin); r['kv_cache_dtype'] = '$dtype'; print(json.dumps(r))" >> "$OUT/plan_bf16.jsonl"
done

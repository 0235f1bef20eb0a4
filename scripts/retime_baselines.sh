#!/usr/bin/env bash
# Re-run (skip_existing=false) the runs of the baselines comparison whose timings were taken while tests
# shared their CPU core (passkey at kv 128, the first CNN/DM runs at kv 128). The newest record of a
# configuration is what scripts/baselines_table.py reports; the older ones stay in runs.jsonl.
set -u
cd "$(dirname "$0")/.."
KVBENCH=${KVBENCH:-.venv/bin/kvbench}
OUT=${OUT:-results/baselines}
COMMON="batch_size=8 task.n_samples=8 skip_existing=false results_dir=$OUT data.dir=${DATA_DIR:-../shared/data}"
run() { $KVBENCH "$@" 2>&1 | tr '\r' '\n' | grep -E '^kvbench:|Error|error:' ; }
P="$COMMON task=passkey task.context_tokens=384 gen.max_new_tokens=8"
run $P policy=full
run $P policy=extreme_decode
run -m $P policy=window,streaming_llm policy.kv_size=128 policy.evict_every=32
run -m $P policy=batch_max,h2o,tova,snapkv,pyramidkv,knorm,keydiff,random policy.schedule=prefill_and_decode,decode_only policy.kv_size=128 policy.evict_every=32
run -m $P policy=streaming_llm,batch_max policy.kv_size=128 policy.evict_every=32 policy.rerotate=true
C="$COMMON task=cnndm task.n_shot=0 task.max_input_tokens=512 gen.max_new_tokens=32"
run $C policy=full
run $C policy=extreme_decode
run -m $C policy=window,streaming_llm policy.kv_size=128 policy.evict_every=32
run -m $C policy=batch_max,h2o,tova,snapkv,pyramidkv policy.schedule=prefill_and_decode,decode_only policy.kv_size=128 policy.evict_every=32

#!/usr/bin/env bash
# `make crosscheck`: kvbench against kvpress 0.5.5 on the same prompt token ids, then the table.
#
# What it does: renders 16 CNN/DM prompts with kvbench (kvbench_side.py prompts), runs every press in
# kvpress's own virtualenv (kvpress_side.py) and every kvbench counterpart in kvbench's (kvbench_side.py
# run), the two sides side by side (one thread each), then writes results/crosscheck/{table.md,
# summary.json} (compare.py). Each side skips the jobs already done in WORK (default .crosscheck/), so an
# interrupted run resumes. ~45 min on 2 cores. Needs the CNN/DM mirror: DATA_DIR (default ../shared/data).
#
#   scripts/crosscheck/run.sh [WORK] [OUT]
#
# One case only (CROSSCHECK_PRESSES, CROSSCHECK_RATIOS, read by both sides), e.g. AdaKV's head-adaptive budgets:
#   CROSSCHECK_PRESSES=adakv CROSSCHECK_RATIOS=0.5 DATA_DIR=../shared/data \
#     scripts/crosscheck/run.sh .crosscheck-adakv results/crosscheck/adakv
set -euo pipefail
WORK=${1:-.crosscheck}
OUT=${2:-results/crosscheck}
DATA_DIR=${DATA_DIR:-../shared/data}
KB=${KVBENCH_PY:-.venv/bin/python}
KP=${KVPRESS_PY:-.venv-kvpress/bin/python}
export OMP_NUM_THREADS=1 TRANSFORMERS_VERBOSITY=error HF_HUB_DISABLE_PROGRESS_BARS=1 TQDM_DISABLE=1
if [ ! -f "$WORK/ids.json" ]; then
  [ -d "$DATA_DIR" ] || { echo "crosscheck: no CNN/DM mirror at DATA_DIR=$DATA_DIR" >&2; exit 2; }
  "$KB" scripts/crosscheck/kvbench_side.py prompts "$WORK" --data-dir "$DATA_DIR"
fi
MODEL_DIR=$("$KB" -c "import json,sys; print(json.load(open(sys.argv[1]))['model_dir'])" "$WORK/ids.json")
"$KP" scripts/crosscheck/kvpress_side.py "$MODEL_DIR" "$WORK" > "$WORK/kvpress.log" 2>&1 &
kp=$!
"$KB" scripts/crosscheck/kvbench_side.py run "$WORK" 2>&1 | tee "$WORK/kvbench.log"
wait $kp || { echo "crosscheck: the kvpress side failed, see $WORK/kvpress.log" >&2; exit 1; }
"$KB" scripts/crosscheck/compare.py "$WORK" "$OUT"

#!/usr/bin/env bash
# CI: the wheel a pip user gets (`make wheel-check`, run by .ci/run after `make test`).
# Builds the wheel (python -m build), checks it (check-wheel-contents), installs it non-editable into a
# throwaway virtual environment, and from a folder outside the checkout runs `kvbench` and
# `kvbench mode=serve` on tiny-llama: both must write an ok record, from the installed copy (configs and
# the paper models' config.json included), never from the checkout.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$here/.venv/bin/python}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "wheel-check: building in $tmp"
"$py" -m build --wheel --outdir "$tmp/dist" "$here" >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; exit 1; }
rm -rf "$here/build"  # setuptools' staging folder in the checkout
"$(dirname "$py")/check-wheel-contents" "$tmp"/dist/*.whl
python3 -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install -q "${TORCH_SPEC:-torch==2.13.0}" "$tmp"/dist/*.whl 2>&1 | grep -v "^WARNING: Location" || true
cd "$tmp"  # outside the checkout: nothing of it is importable from here
export HF_HUB_OFFLINE=1 WANDB_MODE=disabled
common=(model=tiny-llama task.n_samples=2 task.context_tokens=48 gen.max_new_tokens=4 "results_dir=$tmp/results"
        hydra/job_logging=none hydra/hydra_logging=none)
"$tmp/venv/bin/kvbench" "${common[@]}" policy=batch_max policy.kv_size=32 policy.evict_every=8 batch_size=2
"$tmp/venv/bin/kvbench" "${common[@]}" mode=serve policy=h2o policy.kv_size=32 policy.evict_every=8
"$tmp/venv/bin/python" - "$tmp" "$here" <<'PY'
import json, sys
from pathlib import Path

import kvbench
from kvbench.config import CONF_DIR
from kvbench.models.hub import CONFIG_DIR

tmp = Path(sys.argv[1])
assert Path(kvbench.__file__).is_relative_to(tmp / "venv"), f"kvbench imported from {kvbench.__file__}"
assert (CONF_DIR / "config.yaml").is_file() and len(list(CONF_DIR.glob("policy/*.yaml"))) >= 12, CONF_DIR
assert len(list(CONF_DIR.glob("experiment/*.yaml"))) >= 10 and (CONF_DIR / "hydra/launcher/slurm.yaml").is_file()
shipped = sorted(p.name for p in (Path(sys.argv[2]) / "kvbench/models/configs").glob("*.json"))
assert sorted(p.name for p in CONFIG_DIR.glob("*.json")) == shipped and len(shipped) >= 9, CONFIG_DIR
recs = [json.loads(line) for line in (tmp / "results" / "runs.jsonl").read_text().splitlines()]
assert [(r["mode"], r["status"]) for r in recs] == [("run", "ok"), ("serve", "ok")], [(r.get("mode"), r["status"], r["error"]) for r in recs]
print(f"wheel-check: ok ({kvbench.__file__}; {len(recs)} records)")
PY

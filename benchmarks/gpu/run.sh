#!/usr/bin/env bash
# The one GPU call: everything a lent CUDA machine should answer, in ≤ 10 minutes (570 s of section budgets), results under $OUT.
# Runs with the machine's own python3 (no venv travels); scaling_rl comes from this checkout via
# PYTHONPATH; any wheels under .whl/ are installed first, the way the device README says.
#   bash benchmarks/gpu/run.sh                  # on any CUDA box: results under $OUT (default runs/gpu)
#   bash benchmarks/gpu/run.sh --dry            # CPU, tiny sizes (scripts/gpu_emulate.py runs this)
#   bash benchmarks/gpu/run.sh --sections a,e   # a subset (a b c d e f g; see run.py)
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export XLA_PYTHON_CLIENT_PREALLOCATE=${XLA_PYTHON_CLIENT_PREALLOCATE:-false}   # torch shares the GPU (section f)
if compgen -G ".whl/*.whl" >/dev/null; then
  SITE=${GPU_RUN_SITE:-/tmp/site}
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
    || { echo "run.sh: installing the carried wheels failed"; exit 3; }
  export PYTHONPATH="$PYTHONPATH:$SITE"
fi
export OUT=${OUT:-runs/gpu}
mkdir -p "$OUT"
"$PY" benchmarks/gpu/run.py --out "$OUT" "$@" 2>&1 | tee "$OUT/log.txt"

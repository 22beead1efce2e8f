#!/usr/bin/env bash
# The main job: a short training run that writes metrics and a learning-curve PNG.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
OUT=${OUT:-runs/quickstart}
$BIN/scaling-rl train --agent sac --env gymnax/Pendulum-v1 --width 64 --depth 1 --utd 1 \
  --batch-size 128 --lr 3e-4 --seeds 2 --env-steps 10000 --out "$OUT"
echo "quickstart: $OUT/metrics.parquet (tidy metrics), $OUT/curve.png (learning curve); rerun resumes or returns at once"

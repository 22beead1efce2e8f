#!/usr/bin/env bash
# The main job: the quickstart sweep (SAC on Pendulum, 3 widths x 3 UTD ratios x 2 seeds, local
# backend) -> one tidy results table -> scaling-law fit -> report and figures.
# Rerunning resumes: done trials are skipped, the others continue from their last checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
OUT=${OUT:-runs/quickstart}
$BIN/scaling-rl sweep run sweeps/quickstart.yaml --out "$OUT/sweep" --no-progress
$BIN/scaling-rl sweep status "$OUT/sweep"
$BIN/scaling-rl sweep collect "$OUT/sweep"
$BIN/scaling-rl fit "$OUT/sweep/results.parquet" --metric eval_return --out "$OUT/fit"
echo "quickstart: table $OUT/sweep/results.parquet, report $OUT/fit/report.md, figures $OUT/fit/*.png"

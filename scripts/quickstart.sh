#!/usr/bin/env bash
# The main job: the quickstart sweep (sweeps/quickstart.yaml: SAC on Pendulum, 4 widths x 4 UTD
# ratios x 5 vmapped seeds, log-spaced evaluation, local backend) -> one tidy results table ->
# scaling-law fit -> report and figures.
# Rerunning resumes: done trials are skipped, the others continue from their last checkpoint.
# Progress: one plain line every PROGRESS_S seconds (default 15) and whenever a trial finishes, so
# it reads the same in a terminal, under `make quickstart | tee log` and in CI logs.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
OUT=${OUT:-runs/quickstart}
PROGRESS_S=${PROGRESS_S:-15}

# Polls the store (trial_status.json, and train.run's status.json for the chunk of each running
# trial): no TTY needed, no JAX imported, a few small files read per poll. It runs in the
# background (its pid is $WATCH: the python process itself, so `kill` stops it).
WATCHER=$(cat <<'PY'
import json, sys, time
from pathlib import Path

from scaling_rl.sweep.collect import format_eta, status_summary
from scaling_rl.sweep.store import Store

root, every = Path(sys.argv[1]), float(sys.argv[2])
t0, last_line, last_done = time.time(), 0.0, None


def read(path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


while True:
    time.sleep(2)
    if not (root / "trials").is_dir():
        continue
    s = status_summary(root)
    c = s["counts"]
    done = c["done"] + c["diverged"] + c["failed"]
    if done == last_done and time.time() - last_line < every:
        continue
    store, running = Store(root), []
    for tid in store.trial_ids():
        st = store.status(tid)
        if st.get("state") != "running":
            continue
        axes = read(store.trial_dir(tid) / "trial.json").get("axes", {})
        run_dir = root / "packs" / st["packed_in"] if st.get("packed_in") else store.trial_dir(tid)
        prog = read(run_dir / "status.json")
        where = (f"chunk {prog['chunk']}/{prog['num_chunks']}" if prog.get("status") == "running"
                 and prog.get("chunk") else "compiling")
        running.append(" ".join(f"{k}={v}" for k, v in axes.items()) + f" ({where})")
    if not running and done == 0:  # trials still being written or claimed
        continue
    m, sec = divmod(int(time.time() - t0), 60)
    bad = "".join(f" {k}={c[k]}" for k in ("diverged", "failed", "interrupted") if c.get(k))
    print(f"[{m:2d}m{sec:02d}s] sweep: {c['done']}/{s['total']} done{bad} · eta "
          f"{format_eta(s['eta_s'])}" + (" · running: " + "; ".join(running) if running else ""),
          flush=True)
    last_line, last_done = time.time(), done
PY
)

"$BIN/python" -c "$WATCHER" "$OUT/sweep" "$PROGRESS_S" &
WATCH=$!
trap 'kill "$WATCH" 2>/dev/null || true' EXIT
$BIN/scaling-rl sweep run sweeps/quickstart.yaml --out "$OUT/sweep" --no-progress
kill "$WATCH" 2>/dev/null || true
$BIN/scaling-rl sweep status "$OUT/sweep"
$BIN/scaling-rl sweep collect "$OUT/sweep"
# δ = the cost of one env step in FLOPs: on gymnax Pendulum an env step is the actor's forward pass (2 FLOPs
# per actor parameter, ~1e4 at width 32) plus a few hundred FLOPs of physics and the replay write, so
# δ = 3e4 (the report's summary shows where the answer goes at δ×0.1 and δ×10). Thresholds from 10% to 85%
# of the way from the worst to the best return (≈ −1430 … −350): width 4 never gets past about −750, so
# the default rule (levels every cell reaches) would stop at ≈ −1050; above that, width 4 is censored.
$BIN/scaling-rl fit "$OUT/sweep/results.parquet" --metric eval_return --out "$OUT/fit" --delta 3e4 \
  --thresholds 0.1,0.3,0.5,0.7,0.85
echo "quickstart: table $OUT/sweep/results.parquet, report $OUT/fit/report.md, figures $OUT/fit/*.png"

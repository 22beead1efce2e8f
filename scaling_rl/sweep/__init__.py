"""Sweeps: spec -> trials -> backend -> store.

    spec = load_spec("sweeps/quickstart.yaml")        # validated; nothing written yet
    run_sweep(spec, backend="local", workers=2)       # resumable: rerun to finish
    collect(spec.out_dir)                             # -> <out_dir>/results.parquet

See `spec` (format), `store` (layout, claims), `runner` (trial lifecycle), `backends`
(local | slurm | ray), `packing` (several trials in one vmapped program), `collect`.
"""
from __future__ import annotations

from scaling_rl.sweep.collect import collect, status_summary
from scaling_rl.sweep.spec import Spec, SpecError, Trial, load_spec, parse_spec, trial_id
from scaling_rl.sweep.run import prepare, run_sweep
from scaling_rl.sweep.store import Store

__all__ = ["Spec", "SpecError", "Store", "Trial", "collect", "load_spec", "parse_spec",
           "prepare", "run_sweep", "status_summary", "trial_id"]

"""The async benchmark's accounting (issue 20, item 8) on hand-made metrics frames: every mode is
timed over the same steps, the worker's first generation is never free, and the CPU profile
turns per-role CPU seconds into the one-core-per-role speedup. No training (fast)."""
import importlib.util
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
_spec = importlib.util.spec_from_file_location("async_throughput",
                                               ROOT / "benchmarks" / "async_throughput.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)
from experiments.async_rl import add_clocks  # noqa: E402

N, B = 6, 128  # steps, completions per step


def frame(mode: str) -> pd.DataFrame:
    """Step 1: 5 s (sync: compile + generation; async: worker start-up 3 s + generating 2 s);
    later steps 1 s of wall. Sync spends 0.4 CPU s generating + 0.6 training per step; the async
    trainer 0.6 and its worker 0.4 (the same work split over two processes)."""
    rows = [{"step": 0}]
    for s in range(1, N + 1):
        r = {"step": s, "step_s": 5.0 if s == 1 else 1.0, "publish_s": 0.01,
             "trained_on": s * B, "rollouts": s * B, "completions/mean_length": 7.0,
             "completions/max_length": 11.0, "staleness_mean": 0.0}
        if mode == "sync":
            r.update(generation_s=2.0 if s == 1 else 0.4, step_cpu_s=1.0, generation_cpu_s=0.4)
        else:
            r.update({"generation_s": 4.5 if s == 1 else 0.0, "step_cpu_s": 0.6,
                      "generation_cpu_s": 0.0, "source/wait_s": 4.5 if s == 1 else 0.0,
                      "source/queued_groups": 16, "source/worker_gen_s": 2.0 + 0.4 * (s - 1),
                      "source/worker_gen_cpu_s": 0.4 * s, "source/worker_cpu_s": 0.45 * s,
                      "source/worker_load_s": 0.01 * s, "source/worker_blocked_s": 0.5 * s})
        rows.append(r)
    return pd.DataFrame(rows)


def test_every_mode_is_timed_over_the_same_steps():
    sync, areal = (bench.window_stats(frame(m), warmup=2) for m in ("sync", "async"))
    # steps 3..6: 4 steps x 1 s for both, whatever step 1 cost
    assert sync["completions_per_s"] == pytest.approx(4 * B / 4.0)
    assert areal["completions_per_s"] == pytest.approx(sync["completions_per_s"])
    assert sync["steps_timed"] == areal["steps_timed"] == 4
    assert sync["end_to_end_per_s"] == pytest.approx(N * B / (5.0 + N - 1))
    # CPU: the same 1.0 s of work per step, split 0.6 / 0.45 (whole worker process) in async
    assert areal["cpu_per_step_s"] == pytest.approx(1.05)
    assert areal["one_core_per_role_step_s"] == pytest.approx(0.6)
    assert sync["one_core_per_role_step_s"] == pytest.approx(1.0)
    assert areal["worker_gen_cpu_s"] == pytest.approx(0.4)
    assert areal["worker_blocked_s"] == pytest.approx(0.5)
    assert areal["trainer_train_s"] == pytest.approx(1.0 - 0.0 - 0.01)
    with pytest.raises(KeyError):  # a sync run has no worker
        sync["worker_gen_s"]


def test_experiment_clock_charges_the_first_generation_to_async_too():
    # the old clock subtracted the whole 4.5 s first wait (2 s of it generating step 0's groups,
    # which sync pays inside its first step): async got one step of generation for free
    areal = add_clocks(frame("async"))
    assert areal["startup_s"].iloc[0] == pytest.approx(2.5)
    assert areal["wall_s"].iloc[-1] == pytest.approx(5.0 + N - 1 - 2.5)
    sync = add_clocks(frame("sync"))
    assert sync["startup_s"].iloc[0] == 0.0 and sync["wall_s"].iloc[-1] == pytest.approx(5.0 + N - 1)

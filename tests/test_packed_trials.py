"""Packed trials (scaling_rl/sweep/packing.py) give every member exactly the metrics it has when run
alone, from a spec, on CPU; how many trials one program holds follows the machine's memory."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from scaling_rl.sweep import memory, packing, run_sweep
from scaling_rl.sweep.run import prepare
from scaling_rl.sweep.spec import parse_spec
from scaling_rl.sweep.store import Store

BASE = dict(env="gymnax/CartPole-v1", width=8, depth=1, batch_size=4, env_steps=8 + 8,
            learning_starts=8, chunk_env_steps=4, buffer_size=64, val_buffer_size=8)
TIMING = ("wall_time", "chunk_time", "eval_time", "env_steps_per_s")


def _spec(out, pack: bool, grid=None):
    grid = grid or {"seed": [0, 3], "lr": [1e-3, 3e-3], "tau": [0.01, 0.5]}
    return parse_spec({"agent": "dqn", "out_dir": str(out), "seeds": 2, "pack": pack, "base": BASE,
                       "grid": grid})


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    root = tmp_path_factory.mktemp("packed")
    out = {}
    for pack in (True, False):
        spec = _spec(root / ("packed" if pack else "alone"), pack)
        run_sweep(spec, workers=0, progress=False)
        out[pack] = (spec, Store(spec.out_dir))
    return out


def test_packed_members_equal_their_one_by_one_runs(both):
    spec, packed = both[True]
    _, alone = both[False]
    assert len({packed.status(t.id)["packed_in"] for t in spec.trials}) == 1   # one program
    assert all(alone.status(t.id).get("packed_in") is None for t in spec.trials)
    checked = 0
    for t in spec.trials:
        assert packed.status(t.id)["state"] == alone.status(t.id)["state"] == "done"
        a = pd.read_parquet(packed.trial_dir(t.id) / "metrics.parquet")
        b = pd.read_parquet(alone.trial_dir(t.id) / "metrics.parquet")
        assert list(a.columns) == list(b.columns) and len(a) == len(b) == 2 * 2
        assert set(a["seed"]) == {0, 1}
        for c in a.columns:
            if c in TIMING:
                continue
            np.testing.assert_allclose(a[c].to_numpy(float), b[c].to_numpy(float), rtol=1e-5, atol=1e-6,
                                       err_msg=f"{t.id} {c}")
            checked += 1
        cfg = json.loads((packed.trial_dir(t.id) / "config.json").read_text())
        assert cfg["config"] == t.config and cfg["seed"] == t.seed and cfg["seeds"] == 2
    assert checked >= 8 * 10
    # the members really differ (own lr, own τ, own seeds): not eight copies of one run
    losses = {float(pd.read_parquet(packed.trial_dir(t.id) / "metrics.parquet")["loss/critic"].iloc[-1])
              for t in spec.trials}
    assert len(losses) == 8


def test_rerun_of_a_packed_sweep_runs_nothing(both):
    spec, store = both[True]
    before = {t.id: store.status(t.id)["finished"] for t in spec.trials}
    run_sweep(spec, workers=0, progress=False)
    assert {t.id: store.status(t.id)["finished"] for t in spec.trials} == before


def test_pack_size_follows_the_memory_budget(tmp_path, monkeypatch):
    spec = _spec(tmp_path / "s", True, grid={"seed": [0, 3], "lr": [1e-3, 3e-3]})   # 4 trials
    store = prepare(spec)
    t = spec.trials[0]
    per_seed = memory.seed_peak_bytes("dqn", t.config)
    lower = sum(memory.trial_bytes("dqn", t.config, 1).values())
    assert per_seed == memory.UNESTIMATED_HEADROOM * lower > 0
    # room for exactly 2 trials of 2 seeds: 4 trials become 2 packs of 2
    monkeypatch.setenv(memory.BUDGET_ENV, str(int(np.ceil(per_seed * 2 * 2 / memory.PACK_FILL)) + 1))
    assert memory.pack_capacity("dqn", t.config, 2) == 2
    cap = packing.memory_capacity(None)
    parts = packing.groups(store, [x.id for x in spec.trials], cap)
    assert sorted(len(g) for g in parts) == [2, 2]
    # room for 3: still 2 packs, cut evenly (2 + 2, not 3 + 1)
    monkeypatch.setenv(memory.BUDGET_ENV, str(int(np.ceil(per_seed * 3 * 2 / memory.PACK_FILL)) + 1))
    assert memory.pack_capacity("dqn", t.config, 2) == 3
    assert sorted(len(g) for g in packing.groups(store, [x.id for x in spec.trials],
                                                 packing.memory_capacity(None))) == [2, 2]
    # a GPU shared by 2 workers halves the room; never below one trial
    monkeypatch.setenv(memory.BUDGET_ENV, str(int(np.ceil(per_seed * 4 * 2 / memory.PACK_FILL)) + 1))
    assert memory.pack_capacity("dqn", t.config, 2) == 4
    assert memory.pack_capacity("dqn", t.config, 2, mem_fraction=0.5) == 2
    monkeypatch.setenv(memory.BUDGET_ENV, "1KiB")
    assert memory.pack_capacity("dqn", t.config, 2) == 1
    assert sorted(len(g) for g in packing.groups(store, [x.id for x in spec.trials],
                                                 packing.memory_capacity(None))) == [1, 1, 1, 1]


def test_crl_pack_capacity_uses_the_peak_estimate():
    from scaling_rl.agents import crl
    from scaling_rl.nets import memory as net_memory

    config = dict(env="point_maze/u_maze", num_envs=4, env_steps=128, learning_starts=64,
                  chunk_env_steps=64, batch_size=8, width=8, depth=4, actor_width=8, actor_depth=4,
                  repr_dim=4, eval_episodes=2, buffer_size=256, utd=0.25)
    cfg = crl.Config(**config)
    want = net_memory.estimate_peak_bytes(crl, cfg, crl.make(cfg), 1)
    got = memory.seed_peak_bytes("crl", config)
    assert got == want > sum(memory.trial_bytes("crl", config, 1).values())


def test_train_run_refuses_bad_seed_ids(tmp_path):
    from scaling_rl import train
    from scaling_rl.train import ConfigError
    with pytest.raises(ConfigError, match="seed_ids"):
        train.run("dqn", BASE, tmp_path / "r", 2, progress=False, seed_ids=[(0, 0)])
    with pytest.raises(ConfigError, match="seed_ids"):
        train.run("dqn", BASE, tmp_path / "r", 1, progress=False, seed_ids=[("x", 0)])
    assert not (tmp_path / "r").exists()

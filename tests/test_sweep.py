"""Sweep engine: spec validation, trial ids, store, runner, collect, CLI (JAX-free `toy` trials)."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from scaling_rl import cli
from scaling_rl.sweep import (SpecError, Store, collect, load_spec, parse_spec, prepare, run_sweep,
                              status_summary, trial_id)
from scaling_rl.sweep import registry, toy

REPO = Path(__file__).resolve().parent.parent


def write_spec(tmp_path: Path, text: str, name: str = "spec.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


TOY = """\
    name: toytest
    agent: toy
    out_dir: {out}
    env_steps: 400
    seeds: 2
    grid: {{width: [4, 16], utd: [1, 2]}}
    zip: {{lr: [1.0e-3, 3.0e-4], batch_size: [32, 64]}}
"""


# ---- spec ------------------------------------------------------------------------------------
def test_grid_times_zip_expands_and_validates(tmp_path):
    spec = load_spec(write_spec(tmp_path, TOY.format(out=tmp_path / "s")))
    assert len(spec.trials) == 2 * 2 * 2
    assert {(t.config["width"], t.config["utd"], t.config["lr"], t.config["batch_size"])
            for t in spec.trials} == {(w, float(u), lr, b) for w in (4, 16) for u in (1, 2)
                                      for lr, b in ((1e-3, 32), (3e-4, 64))}
    assert all(t.seeds == 2 and t.config["env_steps"] == 400 for t in spec.trials)
    assert len({t.id for t in spec.trials}) == 8
    assert not (tmp_path / "s").exists()  # loading writes nothing


def test_trial_id_is_stable_and_canonical():
    cfg = {"env": "toy/line", "lr": 0.001, "width": 64}
    # a literal: the id must be the same on every machine and Python version
    assert trial_id("toy", cfg, 2, 0) == "95644690a902"
    assert trial_id("toy", dict(reversed(list(cfg.items()))), 2, 0) == trial_id("toy", cfg, 2, 0)
    assert trial_id("toy", cfg, 2, 1) != trial_id("toy", cfg, 2, 0)
    # int vs float for a float field resolves to the same config, hence the same trial
    a = parse_spec({"agent": "toy", "grid": {"utd": [1]}, "out_dir": "x"}).trials[0]
    b = parse_spec({"agent": "toy", "grid": {"utd": [1.0]}, "out_dir": "x"}).trials[0]
    assert a.id == b.id and a.config["utd"] == 1.0


@pytest.mark.parametrize("text, message", [
    ("agent: toy\ngrid: {width: !!python/object/apply:os.system ['echo pwned']}\n", "!!python/object/apply:os.system"),
    ("agent: toy\ngrid: {}\n", "grid: empty"),
    ("agent: toy\ngrid: {width: []}\n", "grid.width: empty list"),
    ("agent: nope\ngrid: {width: [1]}\n", "agent: unknown agent 'nope'; allowed: crl, dpo, dqn, flow_grpo, grpo, sac, toy"),
    ("agent: toy\ngrid: {utd: [1, -2]}\n", "grid.utd: -2 is not allowed"),
    ("agent: toy\nbase: {env: toy/nowhere}\ngrid: {width: [1]}\n", "env: unknown env 'toy/nowhere'; allowed: toy/line"),
    ("agent: toy\ngrid: {widht: [1]}\n", "grid.widht: unknown field; allowed: batch_size"),
    ("agent: toy\ngrid: {width: [1]}\nzip: {lr: [0.1, 0.2], batch_size: [1]}\n", "zip: lists must have equal lengths"),
    ("agent: toy\ngrid: {width: [1]}\nbackend: {name: k8s}\n", "backend.name: unknown backend 'k8s'; allowed: local, slurm, ray"),
    ("agent: toy\ngrid: {width: [1]}\nseeds: 0\n", "seeds: expected an integer >= 1"),
    ("agent: toy\ngrid: {width: [1]}\ncolour: red\n", "colour: unknown spec key"),
    ("agent: toy\ngrid: {lr: [-1.0]}\n", "lr: must be > 0"),
])
def test_bad_specs_fail_in_one_line_with_exit_2_and_write_nothing(tmp_path, capsys, text, message):
    out = tmp_path / "store"
    spec = write_spec(tmp_path, text + f"out_dir: {out}\n")
    with pytest.raises(SpecError) as e:
        load_spec(spec)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert cli.main(["sweep", "run", str(spec)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err and err.startswith("scaling-rl: error:")
    assert not out.exists()


def test_shipped_specs_validate_against_the_agents():
    sizes = {}
    for name in ("quickstart.yaml", "value_scaling_gpu.yaml", "crl_depth_gpu.yaml"):
        data = yaml.safe_load((REPO / "sweeps" / name).read_text())
        assert data["agent"] in registry.known()
        try:
            spec = load_spec(REPO / "sweeps" / name)   # every trial through the agent's Config
        except SpecError as e:
            if "is not available here" in str(e):
                pytest.skip(str(e))
            raise
        sizes[name] = (len(spec.trials), spec.trials[0].seeds)
    assert sizes == {"quickstart.yaml": (16, 5), "value_scaling_gpu.yaml": (192, 5),
                     "crl_depth_gpu.yaml": (7, 5)}
    vs = yaml.safe_load((REPO / "sweeps" / "value_scaling_gpu.yaml").read_text())
    assert vs["grid"]["utd"] == [1, 2, 4, 8]
    for name in ("quickstart.yaml", "value_scaling_gpu.yaml"):  # D_J needs log-spaced logging
        assert yaml.safe_load((REPO / "sweeps" / name).read_text())["base"]["eval_schedule"] == "log"


# ---- runs ------------------------------------------------------------------------------------
def rows_are_complete(store: Store, tid: str) -> pd.DataFrame:
    trial = store.trial(tid)
    cfg = toy.Config.from_dict(trial.config)
    df = pd.read_parquet(store.trial_dir(tid) / "metrics.parquet")
    assert len(df) == cfg.num_chunks * trial.seeds, tid
    assert not df.duplicated(["seed", "chunk"]).any(), tid
    return df


def test_local_run_status_collect_and_rerun_skips_done(tmp_path, capsys):
    spec_path = write_spec(tmp_path, TOY.format(out=tmp_path / "s"))
    assert cli.main(["sweep", "run", str(spec_path), "--workers", "2", "--no-progress"]) == 0
    store = Store(tmp_path / "s")
    tids = store.trial_ids()
    assert len(tids) == 8
    for tid in tids:
        st = store.status(tid)
        assert st["state"] == "done" and st["attempts"] == 1 and st["host"] and st["pid"]
        assert st["finished"] >= st["started"] and st["param_count"] == store.trial(tid).config["width"] ** 2
        rows_are_complete(store, tid)
    # a rerun finds nothing to do: no trial executes again
    assert cli.main(["sweep", "run", str(spec_path), "--workers", "2", "--no-progress"]) == 0
    for tid in tids:
        assert len((store.trial_dir(tid) / "executions.log").read_text().splitlines()) == 1
    capsys.readouterr()
    assert cli.main(["sweep", "status", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert "done" in out and "8" in out
    assert cli.main(["sweep", "collect", str(tmp_path / "s")]) == 0
    df = pd.read_parquet(tmp_path / "s" / "results.parquet")
    assert len(df) == 8 * 4 * 2
    for col in ("trial_id", "agent", "param_count", "seed", "env_steps", "grad_steps", "episode_return",
                "utd", "batch_size", "lr", "width", "depth", "env", "cfg_env_steps", "status"):
        assert col in df.columns, col
    assert not df.duplicated(["trial_id", "seed", "chunk"]).any()
    assert (df["grad_steps"] == df["env_steps"] * df["utd"]).all()
    assert set(df["param_count"]) == {16, 256}


def test_divergence_marks_trial_and_sweep_goes_on_failed_is_retried(tmp_path):
    spec = parse_spec({"agent": "toy", "out_dir": str(tmp_path / "s"), "seeds": 1,
                       "grid": {"diverge_at_chunk": [-1, 2], "fail_at_chunk": [-1, 1]}})
    summary = run_sweep(spec, workers=0, progress=False)
    # (2, 1) fails at chunk 1 before it could diverge at chunk 2
    assert summary["counts"]["done"] == 1 and summary["counts"]["diverged"] == 1
    assert summary["counts"]["failed"] == 2
    store = Store(spec.out_dir)
    by = {(t.config["diverge_at_chunk"], t.config["fail_at_chunk"]): t.id for t in spec.trials}
    div = store.status(by[(2, -1)])
    assert div["state"] == "diverged" and div["step"] == 300 and "non-finite" in div["error"]
    failed = store.status(by[(-1, 1)])
    assert failed["state"] == "failed" and "toy failure at chunk 1" in failed["error"]
    assert (store.trial_dir(by[(-1, 1)]) / "error.txt").exists()
    # a rerun retries the failed trial (it fails again, deterministically), keeps the diverged one
    run_sweep(spec, workers=0, progress=False)
    assert store.status(by[(-1, 1)])["attempts"] == 2
    assert store.status(by[(2, -1)])["attempts"] == 1
    df = collect(spec.out_dir)
    assert set(df.loc[df.trial_id == by[(2, -1)], "chunk"]) == {0, 1}  # rows up to divergence


def test_packing_runs_seed_trials_in_one_program(tmp_path):
    spec = parse_spec({"agent": "toy", "out_dir": str(tmp_path / "s"), "seeds": 2, "pack": True,
                       "grid": {"seed": [0, 1, 2], "width": [4]}})
    run_sweep(spec, workers=0, progress=False)
    store = Store(spec.out_dir)
    packs = {store.status(t.id)["packed_in"] for t in spec.trials}
    assert len(packs) == 1
    pack_dir = store.root / "packs" / packs.pop()
    assert len(pd.read_parquet(pack_dir / "metrics.parquet")) == 3 * 2 * 4
    for t in spec.trials:
        assert store.status(t.id)["state"] == "done"
        df = rows_are_complete(store, t.id)
        assert set(df["seed"]) == {0, 1}
    table = collect(spec.out_dir)
    assert sorted(set(table["seed"])) == [0, 1, 2, 3, 4, 5]


def test_status_reports_interrupted_and_eta(tmp_path):
    spec = parse_spec({"agent": "toy", "out_dir": str(tmp_path / "s"), "grid": {"width": [1, 2, 3]}})
    store = prepare(spec)
    a, b, _ = (t.id for t in spec.trials)
    with store.try_claim(a) as claim:
        store.write_status(claim, "done", wall_s=10.0)
    with store.try_claim(b) as claim:
        store.write_status(claim, "running", attempt_started=1.0, pid=2 ** 22 + 7)
    # b says running but nobody holds its lock: interrupted, resumable
    s = status_summary(spec.out_dir)
    assert s["counts"]["done"] == 1 and s["counts"]["interrupted"] == 1 and s["counts"]["pending"] == 1
    assert s["eta_s"] == pytest.approx(20.0)
    claim = store.try_claim(b)
    assert store.try_claim(b) is None and store.is_locked(b)
    claim.release()
    assert not store.is_locked(b)


def test_dry_run_lists_trials_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "s"
    spec = write_spec(tmp_path, TOY.format(out=out))
    assert cli.main(["sweep", "run", str(spec), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "8 trials" in text and not out.exists()
    assert cli.main(["sweep", "status", str(tmp_path / "nothing")]) == 2


def test_packing_groups_trials_differing_in_lr(tmp_path):
    """Trials differing in seed and lr (the toy's packable field) share one pack, and every member
    trains with its own lr; a width difference (not packable) makes a separate pack."""
    from scaling_rl.sweep import toy

    spec = parse_spec({"agent": "toy", "out_dir": str(tmp_path / "s"), "seeds": 2, "pack": True,
                       "grid": {"seed": [0, 1], "lr": [1e-3, 1e-2], "width": [4, 9]}})
    run_sweep(spec, workers=0, progress=False)
    store = Store(spec.out_dir)
    packs = {}
    for t in spec.trials:
        packs.setdefault(store.status(t.id)["packed_in"], []).append(t)
    assert sorted(len(m) for m in packs.values()) == [4, 4]
    for members in packs.values():
        assert len({m.config["width"] for m in members}) == 1
        assert {m.config["lr"] for m in members} == {1e-3, 1e-2}
        for m in members:
            assert store.status(m.id)["state"] == "done"
            cfg_json = json.loads((store.trial_dir(m.id) / "config.json").read_text())
            df = rows_are_complete(store, m.id)
            offset, first = cfg_json["pack_seed_offset"], min(x.seed for x in members)
            want = [toy.curve(toy.Config.from_dict(m.config), first + offset + s, c)
                    for s, c in zip(df["seed"], df["chunk"])]
            np.testing.assert_allclose(df["episode_return"], want)

"""The training host loop: metrics table, curve, resume (bitwise), config mismatch, divergence,
wandb, and the `scaling-rl train` CLI.

Most tests use a toy agent defined here (noisy SGD on a linear regression, with an rng, a ring
of "replay" data and integer counters in its state), so they test the host loop in seconds and
independently of the real agents; `test_real_agent_*` run a tiny real agent end to end.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest

from scaling_rl import cli, train

TOY = "scaling_rl_test_agents.toy"


# ----------------------------------------------------------------------------- a toy agent
@dataclasses.dataclass(frozen=True)
class ToyConfig:
    env: str = "toy/regression"
    env_steps: int = 64
    chunk_env_steps: int = 16
    utd: float = 2.0
    batch_size: int = 8
    lr: float = 0.05
    width: int = 4
    depth: int = 1
    eval_episodes: int = 2
    nan_at_chunk: int = -1  # inject a NaN loss in this chunk (divergence test)
    eval_schedule: str = "linear"
    eval_points: int = 16
    tags: tuple[str, ...] = ()

    def __post_init__(self):
        if self.utd <= 0:
            raise ValueError(f"utd: must be > 0, got {self.utd}; try utd=1")
        if self.batch_size > self.chunk_env_steps:
            raise ValueError(f"batch_size: {self.batch_size} > buffer {self.chunk_env_steps}; "
                             "use a smaller batch")

    @classmethod
    def from_dict(cls, d):
        d = dict(d)
        d["tags"] = tuple(d.get("tags", ()))
        return cls(**d)


class ToyAgent(types.SimpleNamespace):
    pass


def _toy_make(cfg: ToyConfig):
    true_w = jnp.arange(1.0, cfg.width + 1.0)
    grad_per_chunk = int(cfg.chunk_env_steps * cfg.utd)

    def init(key):
        k1, k2 = jax.random.split(key)
        return {"w": jax.random.normal(k1, (cfg.width,)), "key": k2,
                "data": jnp.zeros((cfg.chunk_env_steps, cfg.width)),
                "env_steps": jnp.zeros((), jnp.int32), "grad_steps": jnp.zeros((), jnp.int32),
                "chunk": jnp.zeros((), jnp.int32), "lr": jnp.asarray(cfg.lr)}  # lr is weak-typed

    def chunk(state):
        key, kd = jax.random.split(state["key"])
        data = jax.random.normal(kd, state["data"].shape)

        def step(carry, k):
            w = carry
            idx = jax.random.randint(k, (cfg.batch_size,), 0, data.shape[0])
            x = data[idx]
            loss_fn = lambda w: jnp.mean((x @ w - x @ true_w) ** 2)
            loss, g = jax.value_and_grad(loss_fn)(w)
            return w - state["lr"] * g, loss

        keys = jax.random.split(key, grad_per_chunk + 1)
        w, losses = jax.lax.scan(step, state["w"], keys[1:])
        loss = losses.mean()
        loss = jnp.where(state["chunk"] == cfg.nan_at_chunk, jnp.nan, loss)
        new = dict(state, w=w, key=keys[0], data=data,
                   env_steps=state["env_steps"] + cfg.chunk_env_steps,
                   grad_steps=state["grad_steps"] + grad_per_chunk, chunk=state["chunk"] + 1)
        metrics = {"env_steps": new["env_steps"], "grad_steps": new["grad_steps"],
                   "episode_return": -loss, "loss/critic": loss,
                   "param_norm": jnp.linalg.norm(w)}
        return new, metrics

    def evaluate(state, key):
        x = jax.random.normal(key, (cfg.eval_episodes, cfg.width))
        return {"eval_return": -jnp.mean((x @ state["w"] - x @ true_w) ** 2)}

    return ToyAgent(init=init, chunk=chunk, evaluate=evaluate,
                    num_chunks=cfg.env_steps // cfg.chunk_env_steps, param_count=cfg.width)


_toy_module = types.ModuleType(TOY)
_toy_module.Config = ToyConfig
_toy_module.make = _toy_make
sys.modules.setdefault("scaling_rl_test_agents", types.ModuleType("scaling_rl_test_agents"))
sys.modules[TOY] = _toy_module


def _data_columns(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=[c for c in train.TIME_COLUMNS if c in df])


def _leaves_equal(a, b) -> None:
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape
        assert x.tobytes() == y.tobytes()  # bitwise, NaN-safe


# ----------------------------------------------------------------------------- host loop
def test_metrics_table_curve_and_status(tmp_path):
    cfg = ToyConfig()
    df = train.run(TOY, cfg, tmp_path, seeds=3, progress=False)
    assert len(df) == 3 * 4
    assert list(df.columns[:4]) == ["seed", "chunk", "env_steps", "grad_steps"]
    assert list(df.columns[-4:]) == list(train.TIME_COLUMNS)
    for col in ("episode_return", "eval_return", "loss/critic", "param_norm"):
        assert col in df and df[col].notna().all()
    for s in range(3):
        per_seed = df[df.seed == s]
        assert per_seed.env_steps.tolist() == [16, 32, 48, 64]
        assert per_seed.grad_steps.tolist() == [32, 64, 96, 128]
        assert per_seed.chunk.tolist() == [0, 1, 2, 3]
    assert sorted(df.seed.unique()) == [0, 1, 2]
    # seeds differ, and learning happens (loss falls)
    assert df[df.chunk == 0]["loss/critic"].nunique() == 3
    assert (df[df.chunk == 3]["loss/critic"].to_numpy() < df[df.chunk == 0]["loss/critic"].to_numpy()).all()
    assert (df.env_steps_per_s > 0).all() and df.wall_time.is_monotonic_increasing

    on_disk = pd.read_parquet(tmp_path / "metrics.parquet")
    pd.testing.assert_frame_equal(on_disk, df)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["agent"] == TOY and config["seeds"] == 3 and config["seed"] == 0
    assert config["config"]["lr"] == 0.05 and "jax" in config["versions"]
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["status"] == "done" and status["summary"]["env_steps"] == 64
    png = (tmp_path / "curve.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert 600 <= width <= 2000 and 300 <= height <= 1200

    # an already complete run returns its table without training
    again = train.run(TOY, cfg, tmp_path, seeds=3, progress=False,
                      on_chunk=lambda *a: pytest.fail("a finished run trained again"))
    pd.testing.assert_frame_equal(again, df)


def test_seed_stream_does_not_depend_on_number_of_seeds(tmp_path):
    two = train.run(TOY, ToyConfig(env_steps=32), tmp_path / "a", seeds=2, progress=False)
    one = train.run(TOY, ToyConfig(env_steps=32), tmp_path / "b", seeds=1, progress=False)
    pd.testing.assert_frame_equal(_data_columns(two[two.seed == 0]).reset_index(drop=True),
                                  _data_columns(one))


class _Kill(Exception):
    pass


def _kill_after(n):
    def on_chunk(chunk, df):
        if chunk + 1 == n:
            raise _Kill
    return on_chunk


def test_resume_is_bitwise_identical(tmp_path):
    cfg = ToyConfig(env_steps=96)  # 6 chunks
    full = train.run(TOY, cfg, tmp_path / "full", seeds=2, progress=False)
    with pytest.raises(_Kill):  # killed after chunk 3 (checkpoint every 2 -> restart from 2)
        train.run(TOY, cfg, tmp_path / "cut", seeds=2, progress=False, checkpoint_every=2,
                  on_chunk=_kill_after(3))
    assert json.loads((tmp_path / "cut" / "status.json").read_text())["status"] == "failed"
    assert len(pd.read_parquet(tmp_path / "cut" / "metrics.parquet")) == 2 * 3
    resumed_chunks = []
    resumed = train.run(TOY, cfg, tmp_path / "cut", seeds=2, progress=False,
                        on_chunk=lambda c, df: resumed_chunks.append(c))
    assert resumed_chunks == [2, 3, 4, 5]
    pd.testing.assert_frame_equal(_data_columns(resumed), _data_columns(full), check_exact=True)
    state_full, meta_full = train.load_state(tmp_path / "full")
    state_cut, meta_cut = train.load_state(tmp_path / "cut")
    assert meta_full["chunk"] == meta_cut["chunk"] == 6
    _leaves_equal(state_full, state_cut)


def test_config_mismatch_is_a_one_line_error(tmp_path):
    train.run(TOY, ToyConfig(env_steps=16), tmp_path, seeds=1, progress=False)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(train.ConfigError) as e:
        train.run(TOY, ToyConfig(env_steps=16, lr=0.1), tmp_path, seeds=1, progress=False)
    assert "config.lr: 0.05 there, 0.1 now" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(train.ConfigError, match="seeds: 1 there, 2 now"):
        train.run(TOY, ToyConfig(env_steps=16), tmp_path, seeds=2, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    import fcntl

    # a finished run is final: it is answered from its status file without taking the lock
    assert train.run(TOY, ToyConfig(env_steps=16), tmp_path, seeds=1, progress=False) is not None
    busy = tmp_path / "busy"
    busy.mkdir()
    with open(busy / ".lock", "a") as held:  # another process is training into this (unfinished) directory
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(train.ConfigError, match="in use by another training process"):
            train.run(TOY, ToyConfig(env_steps=16), busy, seeds=1, progress=False)


def test_divergence_writes_metrics_then_raises(tmp_path):
    with pytest.raises(train.Diverged) as e:
        train.run(TOY, ToyConfig(nan_at_chunk=2), tmp_path, seeds=2, progress=False)
    assert e.value.step == 48
    df = pd.read_parquet(tmp_path / "metrics.parquet")
    assert df.chunk.max() == 2 and len(df) == 6 and df[df.chunk == 2]["loss/critic"].isna().all()
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["status"] == "diverged" and status["step"] == 48 and status["metrics"] == ["loss/critic"]
    with pytest.raises(train.Diverged):  # a rerun reports it again without training
        train.run(TOY, ToyConfig(nan_at_chunk=2), tmp_path, seeds=2, progress=False,
                  on_chunk=lambda *a: pytest.fail("trained again"))


def test_wandb_offline_writes_run_files(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_root"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    train.run(TOY, ToyConfig(env_steps=32), tmp_path / "run", seeds=2, progress=False,
              wandb={"project": "test"})
    runs = list((tmp_path / "wandb_root" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    assert list(runs[0].glob("*.wandb")), sorted(p.name for p in runs[0].iterdir())


def test_progress_bar_runs(tmp_path, capsys):
    train.run(TOY, ToyConfig(env_steps=32), tmp_path, seeds=1, progress=True)
    assert "2/2" in capsys.readouterr().err


# ----------------------------------------------------------------------------- eval schedule
def test_eval_chunks_linear_and_log():
    assert train.eval_chunks(6) == [0, 1, 2, 3, 4, 5]
    assert train.eval_chunks(6, every=4) == [3, 5] and train.eval_chunks(6, every=0) == [5]
    # log: a geometric grid of env steps, first and last chunk always
    assert train.eval_chunks(64, schedule="log", points=7) == [0, 1, 3, 7, 15, 31, 63]
    # collisions early are pushed one chunk on and the rest re-spaced: still `points` distinct chunks
    assert train.eval_chunks(10, schedule="log", points=6) == [0, 1, 2, 4, 6, 9]
    # the warm-up offsets the steps: chunk c ends at 1000 + 100 (c + 1) -> 1100 ... 2200 env steps
    assert train.eval_chunks(12, schedule="log", points=5, chunk_env_steps=100,
                             offset_env_steps=1000) == [0, 2, 4, 7, 11]
    assert train.eval_chunks(5, schedule="log", points=8) == [0, 1, 2, 3, 4]  # fewer chunks: all
    assert train.eval_chunks(3, schedule="log", points=2) == [0, 2]
    for n in range(2, 40):  # always `points` distinct increasing chunks ending with the last
        for p in range(2, n + 1):
            c = train.eval_chunks(n, schedule="log", points=p, chunk_env_steps=7, offset_env_steps=30)
            assert len(c) == p and c[0] == 0 and c[-1] == n - 1 and all(np.diff(c) > 0)


def _eval_steps(df: pd.DataFrame, seed: int = 0) -> list[int]:
    per_seed = df[df.seed == seed]
    return per_seed[per_seed.eval_return.notna()].env_steps.tolist()


def test_log_eval_schedule_steps_and_resume(tmp_path):
    cfg = ToyConfig(env_steps=512, eval_schedule="log", eval_points=6)  # 32 chunks of 16 env steps
    full = train.run(TOY, cfg, tmp_path / "full", seeds=2, progress=False)
    assert len(full) == 2 * 32 and full.episode_return.notna().all()
    for s in range(2):
        assert _eval_steps(full, s) == [16, 32, 64, 128, 256, 512]
    assert json.loads((tmp_path / "full" / "config.json").read_text())["config"]["eval_schedule"] == "log"
    # killed after chunk 10, checkpoint every 4 -> resumes from chunk 8: the same evaluations
    with pytest.raises(_Kill):
        train.run(TOY, cfg, tmp_path / "cut", seeds=2, progress=False, checkpoint_every=4,
                  on_chunk=_kill_after(10))
    assert _eval_steps(pd.read_parquet(tmp_path / "cut" / "metrics.parquet")) == [16, 32, 64, 128]
    resumed_chunks = []
    resumed = train.run(TOY, cfg, tmp_path / "cut", seeds=2, progress=False,
                        on_chunk=lambda c, df: resumed_chunks.append(c))
    assert resumed_chunks == list(range(8, 32))
    assert _eval_steps(resumed) == _eval_steps(resumed, 1) == [16, 32, 64, 128, 256, 512]
    pd.testing.assert_frame_equal(_data_columns(resumed), _data_columns(full), check_exact=True)
    # the linear default is unchanged: every chunk
    assert _eval_steps(train.run(TOY, ToyConfig(), tmp_path / "linear", seeds=1, progress=False)) == [16, 32, 48, 64]
    # a different schedule in the same directory is a different run
    with pytest.raises(train.ConfigError, match="config.eval_points: 6 there, 5 now"):
        train.run(TOY, dataclasses.replace(cfg, eval_points=5), tmp_path / "full", seeds=2, progress=False)


@pytest.mark.parametrize("kw, eval_every, message", [
    ({"eval_schedule": "geometric"}, 1, "eval_schedule: unknown 'geometric'; use 'linear'"),
    ({"eval_schedule": "log", "eval_points": 1}, 1, "eval_points: must be an integer >= 2"),
    ({"eval_schedule": "log", "eval_points": 4.5}, 1, "eval_points: must be an integer >= 2"),
    ({"eval_schedule": "log"}, 2, "eval_every: 2 applies to eval_schedule='linear' only"),
])
def test_eval_schedule_bad_input_is_one_line_and_writes_nothing(tmp_path, kw, eval_every, message):
    with pytest.raises(train.ConfigError, match=message) as e:
        train.run(TOY, ToyConfig(**kw), tmp_path / "run", seeds=1, progress=False, eval_every=eval_every)
    assert "\n" not in str(e.value) and not (tmp_path / "run").exists()


def test_run_dir_from_before_a_new_config_field_resumes(tmp_path):
    """config.json written before eval_schedule/eval_points existed: same run while they keep
    their defaults, a different run otherwise."""
    df = train.run(TOY, ToyConfig(env_steps=32), tmp_path, seeds=1, progress=False)
    record = json.loads((tmp_path / "config.json").read_text())
    for key in ("eval_schedule", "eval_points"):
        del record["config"][key]
    (tmp_path / "config.json").write_text(json.dumps(record))
    again = train.run(TOY, ToyConfig(env_steps=32), tmp_path, seeds=1, progress=False)
    pd.testing.assert_frame_equal(again, df)
    with pytest.raises(train.ConfigError, match="config.eval_schedule: None there, 'log' now"):
        train.run(TOY, ToyConfig(env_steps=32, eval_schedule="log"), tmp_path, seeds=1, progress=False)


def test_cli_log_eval_schedule(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--agent", TOY, "--env-steps", "160", "--eval-schedule", "log", "--eval-points", "3",
            "--out", str(out), "--no-progress"]
    assert cli.main(argv) == 0
    assert _eval_steps(pd.read_parquet(out / "metrics.parquet")) == [16, 48, 160]
    assert cli.main(argv + ["--eval-every", "3"]) == 2
    assert "eval_every: 3 applies to eval_schedule='linear' only" in capsys.readouterr().err


# ----------------------------------------------------------------------------- config parsing
def test_parse_value_types():
    from typing import Literal, Optional

    assert train.parse_value("1e6", int) == 1_000_000
    assert train.parse_value("3e-4", float) == 3e-4
    assert train.parse_value("false", bool) is False
    assert train.parse_value("none", Optional[int]) is None
    assert train.parse_value("7", Optional[int]) == 7
    assert train.parse_value("a,b", tuple[str, ...]) == ("a", "b")
    assert train.parse_value("bro", Literal["bro", "simba"]) == "bro"
    for text, tp in (("1.5", int), ("maybe", bool), ("x", float), ("mlp", Literal["bro", "simba"])):
        with pytest.raises(ValueError):
            train.parse_value(text, tp)


def test_make_config_types_and_errors():
    cfg = train.make_config(TOY, {"lr": "0.5", "batch_size": "4", "tags": "a,b", "utd": 3})
    assert cfg.lr == 0.5 and cfg.batch_size == 4 and cfg.tags == ("a", "b") and cfg.utd == 3
    with pytest.raises(train.ConfigError, match="did you mean lr"):
        train.make_config(TOY, {"lrr": "1"})
    with pytest.raises(train.ConfigError, match="utd: must be > 0"):
        train.make_config(TOY, {"utd": "-1"})
    with pytest.raises(train.ConfigError, match="unknown agent 'nope'"):
        train.make_config("nope", {})


# ----------------------------------------------------------------------------- CLI
@pytest.mark.parametrize("argv, message", [
    (["--agent", "nope"], "unknown agent"),
    (["--utd", "-1"], "utd"),
    (["--batch-size", "64"], "batch_size"),
    (["--set", "nonsense=1"], "nonsense: not a field"),
    (["--set", "lr"], "expected KEY=VALUE"),
    (["--lr", "fast"], "lr"),
    (["--seeds", "0"], "seeds"),
])
def test_cli_bad_input_exit_2_nothing_written(tmp_path, capsys, argv, message):
    out = tmp_path / "run"
    base = ["train", "--agent", TOY, "--out", str(out), "--no-progress"]
    code = cli.main(base + argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and "\n" not in err, err
    assert not out.exists()


def test_cli_bad_flag_type_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "scaling_rl.cli", "train", "--agent", "sac",
                           "--out", str(tmp_path / "r"), "--seeds", "many"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--seeds" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "r").exists()


def test_cli_trains_and_resumes(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--agent", TOY, "--env-steps", "32", "--lr", "0.1", "--seeds", "2",
            "--set", "chunk_env_steps=8", "--out", str(out), "--no-progress"]
    assert cli.main(argv) == 0
    assert "done:" in capsys.readouterr().out
    df = pd.read_parquet(out / "metrics.parquet")
    assert len(df) == 2 * 4 and json.loads((out / "config.json").read_text())["config"]["lr"] == 0.1
    assert (out / "curve.png").exists()
    assert cli.main(argv) == 0  # complete: returns at once
    assert cli.main([a if a != "0.1" else "0.2" for a in argv]) == 2  # a different config
    assert "different run" in capsys.readouterr().err


# ----------------------------------------------------------------------------- real agents
def _tiny_dqn(**kw):
    from scaling_rl.agents import dqn

    base = dict(env="gymnax/CartPole-v1", width=16, depth=1, num_envs=4, learning_starts=64,
                chunk_env_steps=128, env_steps=64 + 3 * 128, batch_size=32, utd=0.25,
                buffer_size=1024, val_buffer_size=256, eval_episodes=2)
    return dqn.Config(**{**base, **kw})


def test_real_agent_table_and_bitwise_resume(tmp_path):
    cfg = _tiny_dqn()
    full = train.run("dqn", cfg, tmp_path / "full", seeds=2, progress=False)
    assert len(full) == 2 * 3 and sorted(full.seed.unique()) == [0, 1]
    for s in range(2):
        per_seed = full[full.seed == s]
        assert per_seed.env_steps.tolist() == [64 + 128 * (c + 1) for c in range(3)]
        assert per_seed.grad_steps.tolist() == [32 * (c + 1) for c in range(3)]
    for col in ("episode_return", "eval_return", "loss/critic", "td_error/train", "td_error/val",
                "param_norm"):
        assert col in full, sorted(full.columns)
    assert np.isfinite(full["loss/critic"]).all() and full["eval_return"].notna().all()
    assert (tmp_path / "full" / "curve.png").stat().st_size > 10_000

    # The directory as a kill right after checkpoint 2 leaves it (the toy tests kill for real):
    # drop checkpoint 3 and the done status, keep the newer metrics file; then rerun.
    final_state = train.load_state(tmp_path / "full")[0]
    shutil.rmtree(tmp_path / "full" / "checkpoints" / "3")
    (tmp_path / "full" / "status.json").write_text('{"status": "running"}')
    resumed_chunks = []
    resumed = train.run("dqn", cfg, tmp_path / "full", seeds=2, progress=False,
                        on_chunk=lambda c, df: resumed_chunks.append(c))
    assert resumed_chunks == [2]
    pd.testing.assert_frame_equal(_data_columns(resumed), _data_columns(full), check_exact=True)
    _leaves_equal(train.load_state(tmp_path / "full")[0], final_state)


@pytest.mark.parametrize("argv, message", [
    (["--batch-size", "512", "--set", "buffer_size=256"], "batch_size"),
    (["--utd", "-1"], "utd"),
    (["--env", "gymnax/Nope-v0"], "env: unknown"),
    (["--set", "n_step=zero"], "n_step"),
    (["--eval-schedule", "geometric"], "eval_schedule: unknown 'geometric'"),
    (["--eval-schedule", "log", "--eval-points", "1"], "eval_points: must be an integer >= 2"),
])
def test_cli_real_agent_bad_input(tmp_path, capsys, argv, message):
    out = tmp_path / "run"
    code = cli.main(["train", "--agent", "sac", "--out", str(out), "--no-progress"] + argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and "\n" not in err, err
    assert not out.exists()


def test_seed_configs_give_each_seed_its_own_learning_rate(tmp_path):
    """Packing η: seed i of a run with per-seed configs is exactly seed i of a plain run with that
    seed's config (same root seed): one program, different optimiser state. Resume keeps them."""
    lrs = (3e-3, 3e-4)
    cfgs = [_tiny_dqn(lr=lr, weight_decay=wd) for lr, wd in zip(lrs, (0.0, 1e-2))]
    packed = train.run("dqn", cfgs[0], tmp_path / "packed", seeds=2, progress=False, seed_configs=cfgs)
    record = json.loads((tmp_path / "packed" / "config.json").read_text())
    tau = cfgs[0].tau
    assert record["seed_hparams"] == [{"lr": 3e-3, "weight_decay": 0.0, "tau": tau},
                                      {"lr": 3e-4, "weight_decay": 1e-2, "tau": tau}]
    state = train.load_state(tmp_path / "packed")[0]
    np.testing.assert_allclose(state.learner["opt"].hyperparams["learning_rate"], lrs, rtol=1e-6)
    alone = train.run("dqn", cfgs[1], tmp_path / "alone", seeds=2, progress=False)
    pd.testing.assert_frame_equal(_data_columns(packed[packed.seed == 1]).reset_index(drop=True),
                                  _data_columns(alone[alone.seed == 1]).reset_index(drop=True),
                                  check_exact=True)
    # seed 0 trained with its own lr and weight decay, so it differs from seed 0 of that run
    assert not np.array_equal(packed[packed.seed == 0]["loss/critic"].to_numpy(),
                              alone[alone.seed == 0]["loss/critic"].to_numpy())

    # resume from checkpoint 2 reproduces the packed run bitwise (the values are in the state)
    shutil.rmtree(tmp_path / "packed" / "checkpoints" / "3")
    (tmp_path / "packed" / "status.json").write_text('{"status": "running"}')
    again = train.run("dqn", cfgs[0], tmp_path / "packed", seeds=2, progress=False, seed_configs=cfgs)
    pd.testing.assert_frame_equal(_data_columns(again), _data_columns(packed), check_exact=True)
    # other per-seed values are a different run
    with pytest.raises(train.ConfigError, match="different run.*seed_hparams"):
        train.run("dqn", cfgs[0], tmp_path / "packed", seeds=2, progress=False, seed_configs=cfgs[::-1])


@pytest.mark.parametrize("configs, message", [
    (lambda: [_tiny_dqn(), _tiny_dqn(width=32)], r"seed_configs\[1\]: differs from cfg outside lr, weight_decay, tau \(width"),
    (lambda: [_tiny_dqn()], "expected a list of 2 configs"),
    (lambda: [{"lr": -1.0}, {}], r"seed_configs\[0\]: lr: must be > 0"),
])
def test_seed_configs_bad_input_is_one_line_and_writes_nothing(tmp_path, configs, message):
    with pytest.raises(train.ConfigError, match=message) as e:
        train.run("dqn", _tiny_dqn(), tmp_path / "run", seeds=2, progress=False, seed_configs=configs())
    assert "\n" not in str(e.value) and not (tmp_path / "run").exists()


def test_seed_configs_need_a_packable_agent(tmp_path):
    with pytest.raises(train.ConfigError, match="no per-seed hyper-parameters"):
        train.run(TOY, ToyConfig(), tmp_path / "run", seeds=1, progress=False, seed_configs=[ToyConfig()])

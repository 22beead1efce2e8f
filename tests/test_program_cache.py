"""The traced-program cache (`scaling_rl.program_cache`): a warm trial loads its programs instead of
tracing them, gets bitwise the same results, and any stale, torn or foreign entry is a miss."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from scaling_rl import program_cache


class Local(NamedTuple):  # a pytree node class outside the allowlist of stored node classes
    w: jax.Array


def step(state, batch: dict):
    """State: optax's ScaleByAdamState (count, mu = weights, nu = (None, weights / 2))."""
    w = state.mu - 0.1 * batch["x"].T @ (batch["x"] @ state.mu - batch["y"])
    new = optax.ScaleByAdamState(count=state.count + 1, mu=w, nu=(None, w / 2))
    return new, {"loss": jnp.mean((batch["x"] @ w - batch["y"]) ** 2)}


def args():
    rng = np.random.default_rng(0)
    return (optax.ScaleByAdamState(jnp.zeros((), jnp.int32), jnp.zeros((3,)), (None, jnp.zeros((3,)))),
            {"x": jnp.asarray(rng.normal(size=(8, 3)), jnp.float32),
             "y": jnp.asarray(rng.normal(size=(8,)), jnp.float32)})


@pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")
def test_miss_then_hit_gives_the_same_pytrees_and_donates(tmp_path):
    want = jax.jit(step)(*args())
    first = program_cache.prepare(step, args(), key={"k": 1}, cache_dir=tmp_path)
    assert first.status == "miss" and len(list(tmp_path.glob("*.prog"))) == 1
    assert first.out_abstract[0].mu.shape == (3,) and first.out_abstract[1]["loss"].dtype == jnp.float32
    second = program_cache.prepare(step, args(), key={"k": 1}, cache_dir=tmp_path, donate=True)
    assert second.status == "hit"
    for prog in (first, second):
        got = prog(*args())
        assert isinstance(got[0], optax.ScaleByAdamState) and int(got[0].count) == 1
        assert got[0].nu[0] is None
        np.testing.assert_array_equal(got[0].mu, want[0].mu)
        np.testing.assert_array_equal(got[1]["loss"], want[1]["loss"])
    state, batch = args()
    second(state, batch)
    assert state.mu.is_deleted()  # donated: the caller's buffers were handed to the program
    assert program_cache.prepare(step, args(), key={"k": 2}, cache_dir=tmp_path).status == "miss"
    assert len(list(tmp_path.glob("*.prog"))) == 2


def test_torn_or_mismatched_entries_are_misses_and_get_rewritten(tmp_path):
    program_cache.prepare(step, args(), key="torn", cache_dir=tmp_path)
    (entry,) = tmp_path.glob("*.prog")
    entry.write_bytes(entry.read_bytes()[:100])  # a torn / foreign file
    prog = program_cache.prepare(step, args(), key="torn", cache_dir=tmp_path)
    assert prog.status == "miss"
    assert program_cache.prepare(step, args(), key="torn", cache_dir=tmp_path).status == "hit"
    # same key, other argument structure (a caller bug): never run a program for other inputs
    state, batch = args()
    other = (state, {**batch, "extra": jnp.zeros(2)})
    assert program_cache.prepare(lambda s, b: step(s, {"x": b["x"], "y": b["y"]}), other, key="torn",
                                 cache_dir=tmp_path).status == "miss"


def test_trees_are_stored_as_json_and_foreign_node_classes_are_not_stored(tmp_path):
    tree = jax.tree.structure(args())
    data = program_cache.encode_tree(tree)
    assert program_cache.decode_tree(json.loads(json.dumps(data))) == tree
    assert data[2][0][0] == "optax._src.transform:ScaleByAdamState"
    with pytest.raises(ValueError, match="outside"):
        program_cache.decode_tree(["os:system", None, []])
    local = lambda w: Local(w * 2)  # noqa: E731
    for _ in range(2):  # runs correctly, but never stored: its output tree names a test-module class
        prog = program_cache.prepare(local, (jnp.ones(2),), key="local", cache_dir=tmp_path)
        assert prog.status == "miss" and float(prog(jnp.ones(2)).w[0]) == 2.0
    assert not list(tmp_path.iterdir())


def test_switch_off_and_no_cache_dir(monkeypatch):
    assert program_cache.prepare(step, args()).status == "off"
    base = jax.config.jax_compilation_cache_dir  # the suite sets one (conftest)
    assert base and program_cache.default_dir() == Path(base) / "programs"
    monkeypatch.setenv("SCALING_RL_PROGRAM_CACHE", "0")
    assert program_cache.default_dir() is None


def test_fingerprint_hashes_the_package_source(tmp_path, monkeypatch):
    fp = program_cache.fingerprint()
    assert len(fp) == 64 and fp == program_cache.fingerprint()
    assert program_cache.key_digest({"a": 1}) != program_cache.key_digest({"a": 2})
    # a copy of the package source hashes the same; one changed byte in any module changes it
    src = Path(program_cache.__file__).resolve().parent
    copy = tmp_path / "scaling_rl"
    for p in src.rglob("*.py"):
        (copy / p.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
        (copy / p.relative_to(src)).write_bytes(p.read_bytes())
    monkeypatch.setattr(program_cache, "__file__", str(copy / "program_cache.py"))
    uncached = program_cache.fingerprint.__wrapped__                # fingerprint() is lru_cached
    assert uncached() == fp
    target = copy / "nets" / "backbone.py"
    data = bytearray(target.read_bytes())
    data[-2] = ord("#") if data[-2] != ord("#") else ord(" ")
    target.write_bytes(bytes(data))
    changed = uncached()
    assert changed != fp
    (copy / "agents" / "new_agent.py").write_text("")               # a new module counts too
    assert uncached() not in (fp, changed)


RUN = textwrap.dedent("""
    import json, sys
    from scaling_rl.sweep.runner import enable_compile_cache
    enable_compile_cache(sys.argv[1])
    from scaling_rl import train
    cfg = {"env": "gymnax/CartPole-v1", "width": 16, "depth": 1, "batch_size": 32,
           "learning_starts": 100, "chunk_env_steps": 200, "eval_episodes": 2, "buffer_size": 1000,
           "env_steps": 400, "lr": float(sys.argv[3])}
    df = train.run("dqn", cfg, out_dir=sys.argv[2], seeds=2, seed=0, progress=False)
    summary = json.load(open(sys.argv[2] + "/status.json"))["summary"]
    print(json.dumps({"cache": summary["program_cache"],
                      "loss": df["loss/critic"].tolist(), "eval": df["eval_return"].fillna(-1).tolist()}))
""")


@pytest.mark.slow
def test_a_warm_trial_loads_its_programs_with_bitwise_equal_results(tmp_path):
    """Fresh processes, like sweep workers: cold, warm (all hits), another η (all hits too: η lives
    in the optimiser state, set from an input after init) against the same run with the cache off."""
    script = tmp_path / "run.py"
    script.write_text(RUN)

    def run(name, lr, **env):
        import os
        proc = subprocess.run([sys.executable, str(script), str(tmp_path / "cache"), str(tmp_path / name),
                               str(lr)], capture_output=True, text=True, timeout=600,
                              env={**os.environ, **env})
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    cold, warm = run("a", 1e-3), run("b", 1e-3)
    assert set(cold["cache"].values()) == {"miss"} and set(warm["cache"].values()) == {"hit"}
    assert warm["loss"] == cold["loss"] and warm["eval"] == cold["eval"]
    other = run("c", 3e-4)
    assert set(other["cache"].values()) == {"hit"}
    plain = run("d", 3e-4, SCALING_RL_PROGRAM_CACHE="0")
    assert set(plain["cache"].values()) == {"off"}
    assert other["loss"] == plain["loss"] and other["eval"] == plain["eval"]
    assert other["loss"] != cold["loss"]

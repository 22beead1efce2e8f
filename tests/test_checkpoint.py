"""Checkpointer: exact round trips of mixed pytrees, retention, async errors surfaced, kills."""
from __future__ import annotations

import math
import os

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scaling_rl.checkpoint import Checkpointer, to_host


@flax.struct.dataclass
class _State:
    params: dict
    key: jax.Array
    typed_key: jax.Array
    step: jax.Array
    buffer: jax.Array


def _state(seed=0):
    k = jax.random.PRNGKey(seed)
    return _State(
        params={"w": jax.random.normal(k, (3, 5)), "b": jnp.array([np.nan, np.inf, -0.0], jnp.float32),
                "h": jax.random.normal(k, (4,)).astype(jnp.bfloat16)},
        key=jax.random.split(k, 2),
        typed_key=jax.random.split(jax.random.key(seed + 1), 2),
        step=jnp.asarray(7, jnp.int32),
        buffer=jnp.arange(12, dtype=jnp.uint8).reshape(3, 4),
    )


def _assert_bitwise(a, b):
    ta, tb = jax.tree.structure(a), jax.tree.structure(b)
    assert ta == tb
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert x.dtype == y.dtype and x.shape == y.shape
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            assert jax.random.key_impl(x) == jax.random.key_impl(y)
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes()


def test_round_trip_is_exact(tmp_path):
    state = _state()
    meta = {"chunk": 3, "rows": [{"seed": 0, "loss": 0.1 + 0.2, "ret": math.nan}]}
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(3, state, meta)
        ckpt.wait()
        assert ckpt.latest_step() == 3
        restored, meta2 = ckpt.restore(3, jax.eval_shape(lambda: state))
    _assert_bitwise(state, restored)
    assert isinstance(restored, _State) and isinstance(restored.params["w"], jax.Array)
    assert meta2["chunk"] == 3 and meta2["rows"][0]["loss"] == 0.1 + 0.2
    assert math.isnan(meta2["rows"][0]["ret"])
    # the restored state is usable by jitted code as is
    assert jax.jit(lambda s: s.params["w"].sum())(restored) == state.params["w"].sum()


def test_retention_and_reopen(tmp_path):
    with Checkpointer(tmp_path, max_to_keep=2) as ckpt:
        for step in (1, 2, 3):
            ckpt.save(step, _state(step), {"chunk": step})
    with Checkpointer(tmp_path) as ckpt:
        assert ckpt.all_steps() == [2, 3] and ckpt.latest_step() == 3
        restored, meta = ckpt.restore(2, jax.eval_shape(_state))
    _assert_bitwise(restored, _state(2))
    assert meta == {"chunk": 2}


def test_saved_copy_is_independent_of_later_mutation(tmp_path):
    """The host copy is taken at save(): later changes (e.g. donated buffers reused by the next
    chunk, a metrics list that keeps growing) do not leak into the checkpoint."""
    params = {"w": np.ones(4, np.float32)}
    rows = [{"chunk": 0}]
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, params, {"rows": rows})
        params["w"][:] = 5.0
        rows.append({"chunk": 1})
        ckpt.wait()
        restored, meta = ckpt.restore(1, {"w": jax.ShapeDtypeStruct((4,), np.float32)})
    assert np.asarray(restored["w"]).tolist() == [1.0] * 4 and meta["rows"] == [{"chunk": 0}]
    assert to_host({"k": jax.random.key(0)})["k"].dtype == np.uint32


def test_existing_step_is_an_error(tmp_path):
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, {"x": np.zeros(2)})
        ckpt.wait()
        # orbax's StepAlreadyExistsError (a ValueError); the stored step is left as it was
        with pytest.raises(ValueError, match=r"step 1 already exists"):
            ckpt.save(1, {"x": np.ones(2)})
        restored, _ = ckpt.restore(1, {"x": jax.ShapeDtypeStruct((2,), np.float64)})
    assert np.asarray(restored["x"]).tolist() == [0.0, 0.0]


def test_unfinished_save_is_ignored(tmp_path):
    """A process killed mid-save leaves a temporary directory; the previous step stays latest."""
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, {"x": np.zeros(2)})
    os.makedirs(tmp_path / "2.orbax-checkpoint-tmp-1234")
    with Checkpointer(tmp_path) as ckpt:
        assert ckpt.latest_step() == 1

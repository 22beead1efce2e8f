"""The jittable ring buffer (scaling_rl.replay): order, sampling, vmap/jit/shard_map, memory maths."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

from scaling_rl import replay

EXAMPLE = {
    "obs": jnp.zeros((17,), jnp.float32),
    "action": jnp.zeros((6,), jnp.float32),
    "reward": jnp.zeros((), jnp.float32),
    "done": jnp.zeros((), jnp.bool_),
}
ENTRY_BYTES = 17 * 4 + 6 * 4 + 4 + 1


def _ids(values):
    """A batch whose `id` leaf numbers the entries and whose `obs` leaf is derived from it."""
    values = jnp.asarray(values, jnp.int32)
    return {"id": values, "obs": jnp.stack([values, -values], axis=-1).astype(jnp.float32)}


ID_EXAMPLE = {"id": jnp.zeros((), jnp.int32), "obs": jnp.zeros((2,), jnp.float32)}
add = jax.jit(replay.add)  # one module-wide cache of compiled adds (per capacity and batch size)


def test_ring_wraps_around_in_order():
    buf = replay.init(5, ID_EXAMPLE)
    buf = add(buf, _ids(np.arange(3)))
    assert int(replay.size(buf)) == 3 and int(buf.position) == 3
    np.testing.assert_array_equal(buf.data["id"], [0, 1, 2, 0, 0])
    buf = add(buf, _ids(np.arange(3, 7)))  # overflows by two: 0 and 1 are overwritten
    np.testing.assert_array_equal(buf.data["id"], [5, 6, 2, 3, 4])
    assert int(replay.size(buf)) == 5 and int(buf.position) == 2
    buf = add(buf, _ids(np.arange(100, 112)))  # more than the capacity: only the last 5 stay
    np.testing.assert_array_equal(buf.data["id"], [108, 109, 110, 111, 107])
    assert int(buf.position) == 4
    np.testing.assert_array_equal(buf.data["obs"][:, 1], -np.asarray(buf.data["id"]))


def test_ring_matches_a_reference_queue():
    rng = np.random.default_rng(0)
    buf, history = replay.init(7, ID_EXAMPLE), []
    for n in rng.choice([2, 5, 9], size=10):  # below, near and above the capacity
        new = np.arange(len(history), len(history) + n)
        history.extend(new)
        buf = add(buf, _ids(new))
        # reading the slots oldest-first gives the newest `capacity` entries in insertion order
        size, pos = int(replay.size(buf)), int(buf.position)
        order = np.roll(np.asarray(buf.data["id"]), -pos) if size == 7 else buf.data["id"][:size]
        np.testing.assert_array_equal(order, history[-7:])


def test_sampling_is_uniform_over_filled_entries_only():
    buf = add(replay.init(100, ID_EXAMPLE), _ids(np.arange(1, 31)))
    draws = 30_000
    batch = jax.jit(replay.sample, static_argnums=2)(buf, jax.random.key(0), draws)
    ids = np.asarray(batch["id"])
    assert ids.min() >= 1 and ids.max() <= 30  # never an unfilled (zero) slot
    np.testing.assert_array_equal(batch["obs"][:, 0], ids)  # leaves sampled jointly
    counts = np.bincount(ids, minlength=31)[1:]
    chi2 = ((counts - draws / 30) ** 2 / (draws / 30)).sum()
    assert chi2 < 58.3  # 99.9% quantile of chi-square with 29 dof


def test_vmap_over_three_independent_buffers():
    bufs = jax.vmap(lambda _: replay.init(4, ID_EXAMPLE))(jnp.arange(3))
    assert bufs.data["id"].shape == (3, 4) and bufs.capacity == 4
    batches = _ids(np.arange(9).reshape(3, 3) * 10)  # each buffer gets its own 3 entries
    vadd = jax.jit(jax.vmap(replay.add))
    bufs = vadd(bufs, batches)
    bufs = vadd(bufs, _ids(np.arange(6).reshape(3, 2) + 1000))
    for i in range(3):
        one = add(replay.init(4, ID_EXAMPLE), _ids(np.arange(3) * 10 + 30 * i))
        one = add(one, _ids(np.arange(2) + 1000 + 2 * i))
        np.testing.assert_array_equal(bufs.data["id"][i], one.data["id"])
        assert int(bufs.position[i]) == int(one.position) == 1
    keys = jax.random.split(jax.random.key(1), 3)
    sample = jax.jit(jax.vmap(functools.partial(replay.sample, batch_size=64)))
    out = sample(bufs, keys)
    for i in range(3):
        assert set(np.asarray(out["id"][i])) <= set(np.asarray(bufs.data["id"][i]))


def test_inside_shard_map_per_device_buffers():
    devices = np.array(jax.devices())
    mesh = Mesh(devices, ("data",))
    d = len(devices)
    bufs = jax.vmap(lambda _: replay.init(8, ID_EXAMPLE))(jnp.arange(d))
    batch = _ids(np.arange(d * 3).reshape(d, 3))

    def local(buf, batch, key):
        # each device holds its own buffer (leading device axis of size 1 in its shard)
        buf = jax.tree.map(lambda x: x[0], buf)
        buf = replay.add(buf, jax.tree.map(lambda x: x[0], batch))
        out = replay.sample(buf, key[0], 16)
        return jax.tree.map(lambda x: x[None], (buf, out))

    step = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=P("data"), out_specs=P("data")))
    bufs, out = step(bufs, batch, jax.random.split(jax.random.key(2), d))
    np.testing.assert_array_equal(replay.size(bufs), [3] * d)
    for i in range(d):
        assert set(np.asarray(out["id"][i])) <= set(range(3 * i, 3 * i + 3))


def test_memory_numbers_are_exact():
    assert replay.nbytes(1000, EXAMPLE) == 1000 * ENTRY_BYTES
    buf = replay.init(1000, EXAMPLE)
    assert sum(x.nbytes for x in jax.tree.leaves(buf.data)) == replay.nbytes(1000, EXAMPLE)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), EXAMPLE)
    assert replay.nbytes(1000, abstract) == 1000 * ENTRY_BYTES  # no arrays needed
    assert replay.check_fits(1000, EXAMPLE) == 1000 * ENTRY_BYTES  # default budget: host memory
    assert replay.check_fits(1000, EXAMPLE, budget_bytes=1000 * ENTRY_BYTES) == 1000 * ENTRY_BYTES


def test_too_big_config_is_a_one_line_error():
    with pytest.raises(ValueError) as err:
        replay.check_fits(10**6, EXAMPLE, budget_bytes=10**6)
    msg = str(err.value)
    assert "\n" not in msg and "1000000" in msg
    assert str(10**6 * ENTRY_BYTES) in msg and f"max capacity that fits is {10**6 // ENTRY_BYTES}" in msg
    with pytest.raises(ValueError, match=f"max capacity that fits is {10**6 // (4 * ENTRY_BYTES)}"):
        replay.check_fits(10**4, EXAMPLE, budget_bytes=10**6, copies=4)  # 4 vmapped seeds
    with pytest.raises(ValueError, match="capacity: must be a positive int"):
        replay.init(0, EXAMPLE)

"""Trajectory-aware replay: future goals stay inside the episode, offsets follow gamma**k."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scaling_rl import goal_replay as gr


def _fill(capacity, num_envs, rows, episode_len_fn, seed=0):
    """Stream `rows` vectorised steps; each step stores (true episode number, step within episode)."""
    rng = np.random.default_rng(seed)
    buf = gr.init(capacity, num_envs, {"ep": jnp.int32(0), "t": jnp.int32(0), "x": jnp.zeros(3)})
    ep = np.zeros(num_envs, int)
    t = np.zeros(num_envs, int)
    length = np.array([episode_len_fn(rng) for _ in range(num_envs)])
    add = jax.jit(gr.add)
    for _ in range(rows):
        done = t + 1 >= length
        buf = add(buf, {"ep": jnp.asarray(ep, jnp.int32), "t": jnp.asarray(t, jnp.int32),
                        "x": jnp.zeros((num_envs, 3))}, jnp.asarray(done))
        t = np.where(done, 0, t + 1)
        ep = ep + done
        length = np.where(done, [episode_len_fn(rng) for _ in range(num_envs)], length)
    return buf


@pytest.mark.parametrize("rows", [37, 150])          # 150 > capacity: the ring has wrapped
def test_future_goal_never_crosses_episode_boundary(rows):
    buf = _fill(64, 5, rows, lambda r: int(r.integers(1, 12)))
    assert int(buf.size) == min(rows, 64)
    now, fut, off = jax.jit(gr.sample, static_argnums=2)(buf, jax.random.PRNGKey(0), 4096, 0.9)
    now, fut, off = jax.tree.map(np.asarray, (now, fut, off))
    assert (fut["ep"] == now["ep"]).all()             # same episode, always
    assert (fut["t"] - now["t"] == off).all()         # offset measured inside the episode
    assert (off >= 0).all() and (off > 0).any()
    # single-step episodes (length 1) can only return themselves
    assert now["t"].min() == 0


def test_offsets_follow_truncated_geometric():
    gamma = 0.9
    buf = _fill(300, 4, 300, lambda r: 1000)          # one long episode per env, truncated at newest row
    now, fut, off = jax.jit(gr.sample, static_argnums=2)(buf, jax.random.PRNGKey(1), 20000, gamma)
    now, off = np.asarray(now["t"]), np.asarray(off)
    # rows far from the newest step: plain geometric; P(k) = (1 - g) g**k
    far = now < 150
    hist = np.bincount(off[far], minlength=10)[:10] / far.sum()
    np.testing.assert_allclose(hist, (1 - gamma) * gamma ** np.arange(10), atol=0.01)
    assert abs(off[far].mean() - gamma / (1 - gamma)) < 0.3
    # the newest step of an unfinished episode has only itself; the one before has {0, 1} ∝ {1, g}
    last = now == 299
    assert (off[last] == 0).all()
    assert (off[now == 298] <= 1).all()
    k = np.asarray(gr.truncated_geometric(jax.random.PRNGKey(2), gamma, jnp.ones(20000, jnp.int32)))
    assert abs(k.mean() - gamma / (1 + gamma)) < 0.015


def test_episode_last_index_by_binary_search():
    buf = _fill(16, 1, 16, lambda r: 5)               # episodes 0..3 of length 5, 4 (ongoing)
    ends = jax.jit(jax.vmap(gr.episode_last_index, in_axes=(None, 0, None)))(buf, jnp.arange(16), 0)
    assert ends.tolist() == [4] * 5 + [9] * 5 + [14] * 5 + [15]


def test_truncated_geometric_support():
    k = gr.truncated_geometric(jax.random.PRNGKey(0), 0.99, jnp.array([0, 1, 3, 500] * 1000))
    k = np.asarray(k).reshape(1000, 4)
    assert (k[:, 0] == 0).all() and k[:, 1].max() <= 1 and k[:, 2].max() <= 3 and k[:, 3].max() <= 500
    assert k[:, 1].min() == 0 and k[:, 1].max() == 1


def test_capacity_error():
    with pytest.raises(ValueError, match="capacity"):
        gr.init(1, 2, {"x": jnp.zeros(2)})
    assert gr.nbytes(10, 2, {"x": jnp.zeros(3)}) == 10 * 2 * (12 + 4)

"""scaling_rl.bridge: zero-copy DLPack conversions and torch_op (autograd through jax.vjp)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from scaling_rl.bridge import to_jax, to_torch, torch_op  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.bool])
def test_torch_to_jax_shares_memory(dtype):
    t = (torch.arange(24) % 3).reshape(4, 6).to(dtype)
    a = to_jax(t)
    assert a.unsafe_buffer_pointer() == t.data_ptr()
    assert str(a.dtype) == str(t.dtype).replace("torch.", "")
    np.testing.assert_array_equal(np.asarray(a.astype(jnp.float32)), t.float().numpy())


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.int32, jnp.bool_])
def test_jax_to_torch_shares_memory(dtype):
    a = (jnp.arange(12) % 2).reshape(3, 4).astype(dtype)
    t = to_torch(a)
    assert t.data_ptr() == a.unsafe_buffer_pointer()
    assert t.shape == (3, 4) and str(t.dtype) == "torch." + str(a.dtype)
    np.testing.assert_array_equal(t.float().numpy(), np.asarray(a.astype(jnp.float32)))


def test_aliasing_hazard_is_real():
    # Documented behaviour: an in-place torch write is visible through the "immutable" JAX array.
    a = jnp.zeros(4)
    to_torch(a)[1] = 7.0
    assert float(a[1]) == 7.0
    t = torch.zeros(4)
    b = to_jax(t)
    t[2] = 5.0
    assert float(b[2]) == 5.0


def test_non_contiguous_tensors_are_copied():
    t = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    for view in (t[:, ::2], t.T, t[::2], t.expand(2, 4, 6)):
        a = to_jax(view)
        np.testing.assert_array_equal(np.asarray(a), view.numpy())
    assert to_jax(t[:, ::2]).unsafe_buffer_pointer() != t.data_ptr()


def test_requires_grad_tensors_are_detached():
    t = torch.ones(3, requires_grad=True)
    a = to_jax(t * 2)
    np.testing.assert_array_equal(np.asarray(a), [2, 2, 2])


def test_int64_without_x64_raises_unless_cast():
    assert not jax.config.jax_enable_x64
    t = torch.tensor([1, 2, 3])  # int64
    with pytest.raises(TypeError, match="cast=True"):
        to_jax(t)
    with pytest.raises(TypeError):
        to_jax(torch.ones(2, dtype=torch.float64))
    a = to_jax(t, cast=True)
    assert a.dtype == jnp.int32 and list(np.asarray(a)) == [1, 2, 3]
    with pytest.raises(OverflowError):
        to_jax(torch.tensor([2**40]), cast=True)


def test_pytrees_round_trip():
    tree = {"a": torch.ones(2), "b": [torch.zeros(3, dtype=torch.int32), 5], "c": None}
    j = to_jax(tree)
    assert isinstance(j["a"], jax.Array) and j["b"][1] == 5 and j["c"] is None
    back = to_torch(j)
    assert torch.equal(back["a"], tree["a"]) and torch.equal(back["b"][0], tree["b"][0])


def _jax_fn(x, y, mask):
    z = jnp.sin(x) * y ** 2
    return {"total": jnp.sum(z * mask) + jnp.mean(jnp.exp(x)), "rows": jnp.sum(z, axis=-1),
            "count": jnp.sum(mask > 0).astype(jnp.int32)}


def _torch_fn(x, y, mask):
    z = torch.sin(x) * y ** 2
    return {"total": (z * mask).sum() + torch.exp(x).mean(), "rows": z.sum(-1)}


def test_torch_op_matches_torch_autograd():
    op = torch_op(_jax_fn)
    g = torch.Generator().manual_seed(0)
    x0, y0 = torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g)
    mask = (torch.rand(3, 5, generator=g) > 0.3).float()
    w = torch.randn(3, generator=g)
    grads = []
    for fn in (op, _torch_fn):
        x, y = x0.clone().requires_grad_(), y0.clone().requires_grad_()
        out = fn(x, y, mask)
        (out["total"] * 2 + (out["rows"] * w).sum()).backward()
        grads.append((out["total"].detach(), x.grad, y.grad))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    out = op(x0, y0, mask)
    assert out["count"].dtype == torch.int32 and int(out["count"]) == int((mask > 0).sum())
    assert not out["count"].requires_grad


def test_torch_op_only_differentiates_what_requires_grad():
    op = torch_op(lambda x, y: jnp.sum(x * y))
    x = torch.ones(3, requires_grad=True)
    y = torch.full((3,), 2.0)
    op(x, y).backward()
    assert torch.equal(x.grad, torch.full((3,), 2.0)) and y.grad is None


def test_torch_op_gradcheck_float64():
    # x64 is process-global in JAX: flip it only inside the context and check it is restored.
    op = torch_op(lambda x, y: (jnp.tanh(x) * y).sum(axis=0) + jnp.log1p(x ** 2).mean())
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    y = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    with jax.enable_x64(True):
        assert torch.autograd.gradcheck(op, (x, y), eps=1e-6, atol=1e-6)
    assert not jax.config.jax_enable_x64
    assert jnp.ones(1).dtype == jnp.float32

"""JAX <-> torch without copies: DLPack both ways, and JAX functions as torch autograd ops.

    to_jax(tree)            torch tensors -> jax arrays (leaves that are not tensors pass through)
    to_torch(tree)          jax arrays -> torch tensors
    torch_op(jax_fn)        a callable on torch tensors whose backward is `jax.vjp` of `jax_fn`

Aliasing hazard: conversions share memory. A torch tensor made by `to_torch(x)` is a *view of the
JAX buffer*: an in-place write through it (`t[0] = 1`, `t.add_(...)`, an optimizer step) changes the
"immutable" JAX array `x` too, and any later JAX computation that reads `x` sees the write. The
same holds the other way for `to_jax(t)` while `t` is alive. Clone on the side that mutates
(`to_torch(x).clone()`) when either side writes in place.

Dtypes: float32, bfloat16, float16, int32, uint8 and bool travel unchanged. 64-bit tensors (int64,
float64) need `jax_enable_x64`; without it JAX would silently narrow them, so `to_jax` raises
instead unless `cast=True` is passed, which narrows explicitly (and still refuses integers that
do not fit in int32).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import torch

__all__ = ["to_jax", "to_torch", "torch_op"]

_NARROW = {torch.int64: torch.int32, torch.float64: torch.float32, torch.uint64: torch.uint32,
           torch.complex128: torch.complex64}


def _x64_enabled() -> bool:
    return bool(jax.config.jax_enable_x64)


def _tensor_to_jax(t: torch.Tensor, cast: bool) -> jax.Array:
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if t.dtype in _NARROW and not _x64_enabled():
        if not cast:
            raise TypeError(
                f"to_jax: {t.dtype} tensor but jax_enable_x64 is off, so JAX would silently narrow it; "
                f"pass cast=True (or .to({_NARROW[t.dtype]}) yourself) or enable x64")
        narrow = _NARROW[t.dtype]
        if not narrow.is_floating_point and t.numel():
            info = torch.iinfo(narrow)
            if int(t.min()) < info.min or int(t.max()) > info.max:
                raise OverflowError(f"to_jax: values of a {t.dtype} tensor do not fit in {narrow}")
        t = t.to(narrow)
    if not t.is_contiguous():
        # JAX accepts only compact strides; step-slices and broadcasts are copied.
        t = t.contiguous()
    return jax.dlpack.from_dlpack(t)


def to_jax(tree: Any, *, cast: bool = False) -> Any:
    """Convert every torch.Tensor leaf of `tree` to a jax.Array sharing its memory where possible.

    Tensors are detached first (autograd history does not cross). Non-contiguous tensors are
    copied. 64-bit tensors without x64 raise TypeError unless `cast=True` narrows them explicitly.
    """
    return jax.tree_util.tree_map(
        lambda x: _tensor_to_jax(x, cast) if isinstance(x, torch.Tensor) else x, tree)


def to_torch(tree: Any) -> Any:
    """Convert every jax.Array leaf of `tree` to a torch.Tensor sharing its memory (see aliasing)."""
    return jax.tree_util.tree_map(
        lambda x: torch.from_dlpack(x) if isinstance(x, jax.Array) else x, tree)


def _zeros_like_out(shape, dtype):
    if jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.complexfloating):
        return jnp.zeros(shape, dtype)
    return jnp.zeros(shape, jax.dtypes.float0)


def torch_op(jax_fn: Callable, *, jit: bool = True) -> Callable:
    """Wrap `jax_fn(*arrays) -> pytree of arrays` as a function of torch tensors with autograd.

    Forward runs `jax.vjp(jax_fn, ...)` (jitted) on the differentiable inputs, i.e. the floating
    tensors that require grad; other arguments (masks, ids, constants, non-tensor values) are
    closed over. Backward feeds the output cotangents to the stored VJP, so torch never re-runs
    the forward. Outputs come back as the same pytree structure with torch tensor leaves.
    Non-tensor arguments must be hashable-free plain values (they are passed positionally).
    """

    @functools.lru_cache(maxsize=64)
    def compiled(diff_mask: tuple[bool, ...]):
        def split_call(diff_args, other_args):
            it_d, it_o = iter(diff_args), iter(other_args)
            args = [next(it_d) if d else next(it_o) for d in diff_mask]
            return jax_fn(*args)

        def fwd(diff_args, other_args):
            out, vjp_fn = jax.vjp(lambda *d: split_call(d, other_args), *diff_args)
            return out, vjp_fn

        def bwd(vjp_fn, cotangents):
            return vjp_fn(cotangents)

        if jit:
            return jax.jit(fwd), jax.jit(bwd)
        return fwd, bwd

    class _Op(torch.autograd.Function):
        @staticmethod
        def forward(ctx, treedef_box, *args):
            diff_mask = tuple(
                isinstance(a, torch.Tensor) and a.is_floating_point() and need
                for a, need in zip(args, ctx.needs_input_grad[1:]))
            jargs = [to_jax(a) for a in args]
            diff_args = tuple(a for a, d in zip(jargs, diff_mask) if d)
            other_args = tuple(a for a, d in zip(jargs, diff_mask) if not d)
            fwd, bwd = compiled(diff_mask)
            out, vjp_fn = fwd(diff_args, other_args)
            leaves, treedef = jax.tree_util.tree_flatten(out)
            treedef_box.append(treedef)
            ctx.vjp_fn, ctx.bwd, ctx.diff_mask = vjp_fn, bwd, diff_mask
            ctx.out_meta = [(leaf.shape, leaf.dtype) for leaf in leaves]
            ctx.treedef = treedef
            outs = tuple(torch.from_dlpack(leaf) for leaf in leaves)
            ctx.mark_non_differentiable(*[o for o in outs if not o.is_floating_point()])
            return outs

        @staticmethod
        def backward(ctx, *grads):
            cts = [
                _zeros_like_out(shape, dtype) if (g is None or not jnp.issubdtype(dtype, jnp.inexact))
                else _tensor_to_jax(g.to(_torch_dtype(jnp.dtype(dtype))), cast=False)
                for g, (shape, dtype) in zip(grads, ctx.out_meta)]
            cotangent = jax.tree_util.tree_unflatten(ctx.treedef, cts)
            diff_grads = iter(ctx.bwd(ctx.vjp_fn, cotangent))
            result = [torch.from_dlpack(next(diff_grads)) if d else None for d in ctx.diff_mask]
            return (None, *result)

    @functools.wraps(jax_fn)
    def op(*args):
        box: list = []
        outs = _Op.apply(box, *args)
        return jax.tree_util.tree_unflatten(box[0], list(outs))

    return op


@functools.lru_cache(maxsize=None)
def _torch_dtype(jax_dtype) -> torch.dtype:
    return torch.from_dlpack(jnp.zeros((), jax_dtype)).dtype

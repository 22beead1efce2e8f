"""Backbones: shapes, exact param/FLOP counts, scanned == unrolled, remat, bf16, CRL residual, errors."""
import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scaling_rl.nets import (
    ACTIVATION_FLOPS,
    ACTIVATIONS,
    Backbone,
    BackboneConfig,
    backbone_flops,
    backbone_flops_breakdown,
    backbone_param_count,
    dense_head_flops,
    dense_head_param_count,
    param_count,
    stack_params,
    unstack_params,
    xla_flops,
)

IN_DIM = 5
DEPTH = {"crl": 8, "bro": 2, "simba": 2, "mlp": 2}  # two blocks each
KINDS = tuple(DEPTH)


def _cfg(kind, **kw):
    return BackboneConfig(kind=kind, width=kw.pop("width", 8), depth=kw.pop("depth", DEPTH[kind]), **kw)


@pytest.fixture(scope="module")
def x():
    return jax.random.normal(jax.random.key(0), (3, IN_DIM))


@pytest.fixture(scope="module")
def unrolled(x):
    """kind -> (cfg, params) of the unrolled stack, initialised once."""
    out = {}
    for kind in KINDS:
        cfg = _cfg(kind, scan=False)
        out[kind] = (cfg, Backbone(cfg).init(jax.random.key(1), x))
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_output_shape_and_dtype(kind, unrolled, x):
    cfg, params = unrolled[kind]
    y = Backbone(cfg).apply(params, x)
    assert y.shape == (3, cfg.width) and y.dtype == jnp.float32
    y3 = Backbone(cfg).apply(params, jnp.stack([x, x]))  # arbitrary leading axes
    assert y3.shape == (2, 3, cfg.width)
    np.testing.assert_allclose(y3[1], y, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind,width,depth,scan", [
    ("crl", 8, 4, True), ("crl", 6, 12, False), ("bro", 8, 1, True), ("bro", 5, 3, False),
    ("simba", 8, 2, True), ("simba", 4, 3, False), ("mlp", 7, 3, True), ("mlp", 8, 1, False),
])
def test_param_count_is_exact(kind, width, depth, scan):
    cfg = BackboneConfig(kind=kind, width=width, depth=depth, scan=scan)
    shapes = jax.eval_shape(Backbone(cfg).init, jax.random.key(0), jnp.zeros((1, IN_DIM)))
    assert param_count(shapes) == backbone_param_count(cfg, IN_DIM)


def test_param_count_by_hand():
    # crl w=4, one block: input Dense 3*4+4, input LN 8, 4 x (Dense 16+4, LN 8) = 16 + 8 + 112
    assert backbone_param_count(BackboneConfig(kind="crl", width=4, depth=4), 3) == 136
    # simba w=2, one block: Dense 3*2+2, LN 4, Dense 2->8 (16+8), Dense 8->2 (16+2), final LN 4
    assert backbone_param_count(BackboneConfig(kind="simba", width=2, depth=1), 3) == 8 + 4 + 24 + 18 + 4
    head = nn.Dense(3).init(jax.random.key(0), jnp.zeros((1, 10)))
    assert param_count(head) == dense_head_param_count(10, 3) == 33
    assert dense_head_flops(10, 3) == 2 * 10 * 3 + 3


def test_flops_by_hand():
    # crl w=4, in=3, one block (4 Dense), swish (4 per element), LayerNorm 7d+4.
    bd = backbone_flops_breakdown(BackboneConfig(kind="crl", width=4, depth=4), 3)
    assert bd == {"matmul": 2 * 3 * 4 + 4 * 2 * 4 * 4, "bias": 4 + 4 * 4, "norm": 5 * (7 * 4 + 4),
                  "activation": 5 * 4 * 4, "residual": 4}
    # bro w=4, in=3, two blocks, relu: per block 2 Dense, 2 LN, 1 relu, 1 residual add.
    bd = backbone_flops_breakdown(BackboneConfig(kind="bro", width=4, depth=2), 3)
    assert bd == {"matmul": 24 + 2 * 2 * 32, "bias": 4 + 2 * 8, "norm": 5 * 32, "activation": 4 + 2 * 4,
                  "residual": 2 * 4}
    # simba w=2, in=3, one block: Dense 2->8 and 8->2, pre-LN and final LN, relu on the 8 hidden units.
    bd = backbone_flops_breakdown(BackboneConfig(kind="simba", width=2, depth=1), 3)
    assert bd == {"matmul": 12 + 32 + 32, "bias": 2 + 8 + 2, "norm": 2 * 18, "activation": 8, "residual": 2}
    assert backbone_flops(BackboneConfig(kind="mlp", width=4, depth=1), 3) == 24 + 4 + 4 + 32 + 4 + 4


@pytest.mark.parametrize("kind", KINDS)
def test_flops_match_xla(kind, unrolled):
    """Our count == XLA's count of the unoptimised program, exactly. XLA's optimised count differs only
    by elementwise ops that fusion recomputes: within 10% at width 32 (tolerance stated in costs.py)."""
    cfg, params = unrolled[kind]
    assert xla_flops(Backbone(cfg).apply, params, jnp.zeros((1, IN_DIM)), compiled=False) == \
        backbone_flops(cfg, IN_DIM)
    wide = dataclasses.replace(cfg, width=32)
    one = jax.ShapeDtypeStruct((1, IN_DIM), jnp.float32)
    shapes = jax.eval_shape(Backbone(wide).init, jax.random.key(0), one)
    compiled = xla_flops(Backbone(wide).apply, shapes, one)
    if compiled is not None:  # some backends report no cost analysis
        ours = backbone_flops(wide, IN_DIM)
        assert abs(compiled - ours) <= 0.10 * ours, (compiled, ours)
        assert backbone_flops_breakdown(wide, IN_DIM)["matmul"] >= 0.75 * compiled


def test_activation_tables_agree():
    assert set(ACTIVATIONS) == set(ACTIVATION_FLOPS)


@pytest.mark.parametrize("kind", KINDS)
def test_scanned_equals_unrolled(kind, unrolled, x):
    cfg, params = unrolled[kind]
    scanned_cfg = dataclasses.replace(cfg, scan=True)
    stacked = stack_params(params)
    init_shapes = jax.eval_shape(Backbone(scanned_cfg).init, jax.random.key(0), x)
    assert jax.tree.structure(stacked) == jax.tree.structure(init_shapes)
    assert jax.tree.map(jnp.shape, stacked) == jax.tree.map(lambda s: s.shape, init_shapes)
    y_unrolled = jax.jit(Backbone(cfg).apply)(params, x)
    y_scanned = jax.jit(Backbone(scanned_cfg).apply)(stacked, x)
    np.testing.assert_array_equal(y_scanned, y_unrolled)   # bit for bit
    back = unstack_params(stacked)
    assert jax.tree.structure(back) == jax.tree.structure(params)
    assert all(jax.tree.leaves(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), back, params)))


def test_scanned_program_does_not_grow_with_depth():
    x = jax.ShapeDtypeStruct((2, IN_DIM), jnp.float32)

    def program_size(depth):
        model = Backbone(BackboneConfig(kind="crl", width=8, depth=depth))
        return len(jax.jit(model.apply).lower(jax.eval_shape(model.init, jax.random.key(0), x), x).as_text())

    assert program_size(256) <= 1.05 * program_size(8)


def _grad_program(cfg, x):
    model = Backbone(cfg)
    params = model.init(jax.random.key(4), x)
    return params, jax.jit(jax.value_and_grad(lambda p: jnp.mean(model.apply(p, x) ** 2)))


def test_scan_saves_only_matmul_outputs_with_the_same_gradients(monkeypatch):
    """The save policy (docs/deep_stacks.md): the forward loop keeps 4 matmul outputs + the block
    input per CRL block instead of 28 arrays; the same loss and gradients to float32 rounding (the
    recomputed elementwise ops fuse differently, as they already did between scanned and unrolled; bit
    for bit on some CPUs, a few ulps apart on others, e.g. AMD EPYC: 3.1009908 vs 3.1009903)."""
    from scaling_rl.nets import backbone, block_saved_bytes_per_row, memory

    x = jax.random.normal(jax.random.key(5), (8, IN_DIM))
    cfg = BackboneConfig(kind="crl", width=16, depth=16)
    params, grad = _grad_program(cfg, x)
    loss, g = grad(params)
    saved = grad.lower(params).compile()
    unrolled_params = unstack_params(params)
    u_loss, u_g = _grad_program(dataclasses.replace(cfg, scan=False), x)[1](unrolled_params)
    monkeypatch.setattr(backbone, "SCAN_SAVE_POLICY", None)        # JAX's scan saving everything
    _, everything = _grad_program(cfg, x)
    old_loss, old_g = everything(params)
    np.testing.assert_allclose([float(loss), float(old_loss)], float(u_loss), rtol=1e-6, atol=0)
    close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)  # noqa: E731
    jax.tree.map(close, g, old_g)
    jax.tree.map(close, g, stack_params(u_g))

    nb, row = cfg.num_blocks, 4 * cfg.width * x.shape[0]           # one (batch, width) f32 array
    kept = memory.while_loop_stacked_buffers(saved.as_text(), nb)
    before = memory.while_loop_stacked_buffers(everything.lower(params).compile().as_text(), nb)
    block_params = param_count(params["params"]["blocks"]) * 4      # stacked kernels, biases, scales
    forward_now = max(b for _, b in kept[:1]) - block_params
    forward_before = max(b for _, b in before[:1]) - block_params
    assert forward_now == nb * (4 + 1) * row == nb * block_saved_bytes_per_row(cfg) * x.shape[0]
    assert forward_before >= nb * 28 * row


def test_remat_keeps_only_the_block_input():
    from scaling_rl.nets import backbone_activation_bytes, memory

    x = jnp.ones((8, IN_DIM))
    cfg = BackboneConfig(kind="crl", width=16, depth=16, remat=True)
    params, grad = _grad_program(cfg, x)
    loops = memory.while_loop_stacked_buffers(grad.lower(params).compile().as_text(), cfg.num_blocks)
    block_params = param_count(params["params"]["blocks"]) * 4
    assert loops[0][1] - block_params == backbone_activation_bytes(cfg, 8) == 4 * 16 * 8 * 4


def test_stack_params_finds_nested_backbone(unrolled):
    _, params = unrolled["bro"]
    nested = {"params": {"critic": {"backbone": params["params"], "head": {"kernel": jnp.ones((8, 1))}}}}
    stacked = stack_params(nested)
    assert set(stacked["params"]["critic"]["backbone"]) == {"input_dense", "input_norm", "blocks"}
    assert stacked["params"]["critic"]["backbone"]["blocks"]["dense_0"]["kernel"].shape == (2, 8, 8)
    assert stacked["params"]["critic"]["head"]["kernel"].shape == (8, 1)


@pytest.mark.parametrize("scan", [True, False])
def test_remat_same_output_and_gradient(scan, x):
    cfg = _cfg("crl", scan=scan)
    params = Backbone(cfg).init(jax.random.key(2), x)

    def loss(cfg):
        return lambda p: jnp.mean(Backbone(cfg).apply(p, x) ** 2)

    plain = jax.jit(jax.value_and_grad(loss(cfg)))(params)
    remat = jax.jit(jax.value_and_grad(loss(dataclasses.replace(cfg, remat=True))))(params)
    np.testing.assert_allclose(remat[0], plain[0], rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), remat[1], plain[1])


@pytest.mark.parametrize("kind", KINDS)
def test_bfloat16_path(kind, unrolled, x):
    cfg, params = unrolled[kind]
    bf16 = dataclasses.replace(cfg, compute_dtype="bfloat16")
    apply = jax.jit(Backbone(bf16).apply)
    y = apply(params, x)
    y32 = jax.jit(Backbone(cfg).apply)(params, x)
    assert y.dtype == jnp.float32
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(
        jax.eval_shape(Backbone(bf16).init, jax.random.key(0), x)))
    hlo = apply.lower(params, x).as_text()
    assert "bf16" in hlo  # matmuls really run in bfloat16
    scale = float(jnp.max(jnp.abs(y32)))
    np.testing.assert_allclose(y, y32, atol=5e-2 * max(scale, 1.0), rtol=0)


def _layer_norm(h, p, eps=1e-6):
    h = np.asarray(h, np.float64)
    mean, var = h.mean(-1, keepdims=True), h.var(-1, keepdims=True)
    return (h - mean) / np.sqrt(var + eps) * np.asarray(p["scale"]) + np.asarray(p["bias"])


def _swish(h):
    return h / (1.0 + np.exp(-h))


def test_crl_block_by_hand(x):
    cfg = BackboneConfig(kind="crl", width=6, depth=4)
    params = Backbone(cfg).init(jax.random.key(3), x)
    p = params["params"]
    blk = jax.tree.map(lambda a: np.asarray(a[0], np.float64), p["blocks"])  # the one scanned block

    def dense(h, q):
        return h @ np.asarray(q["kernel"], np.float64) + np.asarray(q["bias"], np.float64)

    h0 = _swish(_layer_norm(dense(np.asarray(x, np.float64), p["input_dense"]), p["input_norm"]))
    h = h0
    for i in range(4):
        h = _swish(_layer_norm(dense(h, blk[f"dense_{i}"]), blk[f"norm_{i}"]))
    np.testing.assert_allclose(Backbone(cfg).apply(params, x), h0 + h, rtol=1e-4, atol=1e-5)

    # Zeroing a block's params makes it the identity: Dense -> 0, LN(0) = bias = 0, swish(0) = 0.
    zeroed = {"params": {**p, "blocks": jax.tree.map(jnp.zeros_like, p["blocks"])}}
    np.testing.assert_allclose(Backbone(cfg).apply(zeroed, x), h0, rtol=1e-5, atol=1e-6)


def test_default_activation_per_kind():
    assert BackboneConfig(kind="crl", depth=4).activation_name == "swish"
    assert BackboneConfig(kind="bro").activation_name == "relu"
    assert BackboneConfig(kind="crl", depth=4, activation="relu").activation_name == "relu"


@pytest.mark.parametrize("kwargs,message", [
    ({"kind": "crl", "depth": 6}, r"^depth: .*multiple of 4.*got 6; use 4 or 8$"),
    ({"kind": "crl", "depth": 0}, r"^depth: .*got 0; use 4$"),
    ({"kind": "bro", "depth": 0}, r"^depth: must be >= 1, got 0"),
    ({"kind": "resnet"}, r"^kind: unknown 'resnet'; use one of 'crl', 'bro', 'simba', 'mlp'$"),
    ({"width": 0}, r"^width: must be >= 1"),
    ({"width": 2.5}, r"^width: must be an int"),
    ({"activation": "sigmoidish"}, r"^activation: unknown 'sigmoidish'"),
    ({"init": "uniformish"}, r"^init: unknown 'uniformish'; use one of"),
    ({"compute_dtype": "float16"}, r"^compute_dtype: unknown 'float16'; use one of 'float32', 'bfloat16'$"),
    ({"scan": "yes"}, r"^scan: must be a bool"),
])
def test_bad_config_raises_one_line_error(kwargs, message):
    with pytest.raises(ValueError, match=message) as err:
        BackboneConfig(**kwargs)
    assert "\n" not in str(err.value)

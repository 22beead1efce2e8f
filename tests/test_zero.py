"""ZeRO-1 (scaling_rl/zero.py): the sharded-optimiser update of CRL and SAC over 4 forced CPU devices equals
the replicated data-parallel update, and each device holds 1/4 of the optimiser moments.

Runs tests/zero_check.py in a subprocess (the device count is fixed when jax is first imported)."""
import pytest
from forced_devices import run_check


@pytest.fixture(scope="module")
def four_devices():
    return run_check("zero_check.py")


@pytest.mark.parametrize("algo", ["crl", "sac"])
def test_zero_update_equals_replicated(four_devices, algo):
    assert four_devices["devices"] == 4
    r = four_devices[algo]
    assert r["change"] > 1e-5, r            # the updates moved the parameters
    assert r["params"] <= 1e-6, r           # ... identically up to float summation order
    assert r["metrics"] <= 1e-5, r
    assert r["init_same_shapes"], r          # the agent's own ZeRO init builds this state layout


def test_clipping_uses_the_global_norm_of_the_whole_gradient(four_devices):
    # gradient norm >> max_grad_norm = 1: clipping fires and changes the update, and the sharded
    # update still equals optax's clip_by_global_norm + SGD-momentum on the whole mean gradient
    r = four_devices["clip"]
    assert r["grad_norm"] > 2.0, r
    assert r["clipped"]["vs_optax"] <= 1e-6 and r["unclipped"]["vs_optax"] <= 1e-6, r
    assert r["clip_effect"] > 1e-3, r


@pytest.mark.parametrize("algo", ["crl", "sac"])
def test_optimizer_moments_are_sharded_four_ways(four_devices, algo):
    shapes = four_devices[algo]["shapes"]  # [global shape, shape on device 0] per state leaf
    moments = [(g, d) for g, d in shapes if g]
    assert moments, shapes
    for g, d in moments:
        assert d[0] * 4 == g[0] and d[1:] == g[1:], (g, d)
    assert all(d == [] for g, d in shapes if not g)  # step counts / learning rates: replicated scalars


def test_crl_sharded_state_is_a_quarter_of_the_replicated_one(four_devices):
    r = four_devices["crl"]
    import math
    rep = sum(math.prod(s) for s in r["rep_shapes"])
    per_device = sum(math.prod(d) for _, d in r["shapes"])
    assert rep > 1000
    assert per_device <= rep / 4 + 16, (per_device, rep)  # + scalars and whole-kept odd leaves

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


def test_crl_acco_flag_zero_delay_equals_zero1_and_acco_trains(four_devices):
    a = four_devices["crl"]["acco"]
    # acco=ddp (no overlap, zero delay) is the ZeRO-1 update: same numbers
    assert a["ddp"]["vs_zero"] <= 1e-6 and a["ddp"]["metrics_vs_zero"] <= 1e-5, a
    assert a["ddp"]["pending_count"] == [0.0] * 4
    # acco=acco trains (finite, moves the parameters) and is a different update (half-shard micro-batches,
    # the second at the estimate θ̃), with one micro-batch per device pending for the next update
    assert a["acco"]["finite"] and a["acco"]["change"] > 1e-5, a
    assert a["acco"]["vs_zero"] > 1e-6, a
    assert a["acco"]["pending_count"] == [1.0] * 4
    assert a["init_same_shapes"], a
    assert all(g[0] == 4 and d[0] == 1 and d[1:] == g[1:] for g, d in a["pending_shapes"]), a["pending_shapes"]


def test_sac_acco_flag_trains(four_devices):
    a = four_devices["sac"]["acco"]
    assert a["finite"] and a["change"] > 1e-5 and a["vs_zero"] > 1e-6, a
    assert a["pending_count"] == [1.0] * 4


@pytest.mark.parametrize("agent", ["crl", "sac"])
def test_acco_flag_needs_zero_optimizer_and_a_known_mode(agent):
    import importlib
    mod = importlib.import_module(f"scaling_rl.agents.{agent}")
    with pytest.raises(ValueError, match="^acco: 'acco' runs on the sharded optimiser; also set zero_optimizer"):
        mod.Config(acco="acco")
    with pytest.raises(ValueError, match="^acco: unknown 'zero'"):
        mod.Config(acco="zero", zero_optimizer=True)

"""ACCO (scaling_rl/acco.py) on 2 forced CPU devices with a ZeRO-1 sharded optimiser, and the tiny decoder
LM it is checked on (scaling_rl/tiny_lm.py). Runs tests/acco_check.py in a subprocess (the device count
is fixed when jax is first imported)."""
import numpy as np
import pytest
from forced_devices import run_check


@pytest.fixture(scope="module")
def two_devices():
    return run_check("acco_check.py")


def test_zero_delay_equals_data_parallel_step(two_devices):
    r = two_devices
    assert r["devices"] == 2
    assert r["ddp_change"] > 1e-3
    assert r["ddp_vs_optax"] <= 1e-6 * max(1.0, r["ddp_change"] * 1e3), r
    assert r["ddp_loss_vs_direct"] <= 1e-5


def test_heterogeneous_workers_average_the_micro_batches_they_computed(two_devices):
    r = two_devices
    # 2 + 1 micro-batches per round: the update is that of the mean over those 6, not of 8 ...
    assert r["hetero_vs_optax"] <= 1e-6, r
    # ... and differs from the equal-count update
    assert r["hetero_vs_equal"] > 1e-4, r


def test_state_is_sharded_as_claimed(two_devices):
    shapes = two_devices["shapes"]
    moments = [(g, d) for g, d in shapes["opt"] if g]
    assert moments and all(d[0] * 2 == g[0] and d[1:] == g[1:] for g, d in moments), moments
    # one pending gradient per device, each the full parameter shape
    assert [g[1:] for g, _ in shapes["pending"]] == shapes["params"]
    assert all(g[0] == 2 and d[0] == 1 and d[1:] == g[1:] for g, d in shapes["pending"])


def test_delay_hurts_the_transformer_and_acco_closes_most_of_the_gap(two_devices):
    c = two_devices["curves"]
    last = {m: float(np.mean(v["train"][-10:])) for m, v in c.items()}
    ev = {m: v["eval"] for m, v in c.items()}
    first = c["ddp"]["train"][0]
    assert last["ddp"] < first - 1.0, last            # DDP learns the task (from ~log 16 + init)
    gap = ev["dpu"] - ev["ddp"]
    assert gap > 0.5, ev                              # the one-step delay degrades it measurably
    assert ev["acco"] - ev["ddp"] < 0.3 * gap, ev     # ACCO closes >= 70% of that gap


def test_unknown_mode_is_a_one_line_error():
    import optax

    from scaling_rl import acco, zero
    with pytest.raises(ValueError, match="^mode: unknown 'zero'"):
        acco.Acco(lambda p, b: 0.0, zero.ShardedOptimizer(optax.sgd(0.1), 2), "zero")

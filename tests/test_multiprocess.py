"""One learner over several JAX processes (gloo CPU collectives, coordinator on localhost) computes what
one process with the same number of devices computes: the data-parallel mesh spans processes unchanged
(issue 24, part 1), and what one process with one device computes, to float summation order (SAC; CRL
with `global_negatives=True` — with per-device negatives, CRL's default, its InfoNCE is another loss)."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from scaling_rl.multiprocess import free_port

CHECK = Path(__file__).with_name("multiprocess_check.py")
# Four fresh JAX processes compiling SAC, CRL and CRL-global updates: the slow suite (`make test-slow`,
# docs/testing.md). `make test` keeps multi-process training (tests/test_multiprocess_train.py: two
# processes train, are killed, resume, move checkpoints between process counts) and the 2- and 8-device
# data-parallel equivalences (test_crl.py, test_parallel.py).
pytestmark = pytest.mark.slow


def _result(proc) -> dict:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-6000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def runs():
    port = free_port()
    procs = [subprocess.Popen([sys.executable, str(CHECK), "proc", str(i), "2", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    two_procs = [_result(p) for p in procs]   # alone: a starved process stalls its partner
    singles = [subprocess.Popen([sys.executable, str(CHECK), "devices", str(n)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n in (2, 1)]
    one_proc, one_device = (_result(p) for p in singles)
    return two_procs, one_proc, one_device


@pytest.mark.parametrize("agent", ["sac", "crl", "crl_global"])
def test_two_processes_equal_one_process_with_two_devices(runs, agent):
    two_procs, one_proc, _ = runs
    for r in two_procs:
        assert (r[agent]["devices"], r[agent]["processes"]) == (2, 2)
    assert (one_proc[agent]["devices"], one_proc[agent]["processes"]) == (2, 1)
    # Every process holds the same replicated state ...
    assert two_procs[0][agent] == two_procs[1][agent]
    # ... and it is the single-process 2-device state (same program, same summation order).
    for key in ("sum", "abs"):
        np.testing.assert_allclose(two_procs[0][agent][key], one_proc[agent][key], rtol=1e-6, atol=1e-6)
    assert two_procs[0][agent]["metrics"].keys() == one_proc[agent]["metrics"].keys()
    np.testing.assert_allclose(list(two_procs[0][agent]["metrics"].values()),
                               list(one_proc[agent]["metrics"].values()), rtol=1e-5, atol=1e-6)
    # Training moved the state (a check that compares two untouched inits would pass trivially).
    assert any(abs(v) > 0 for v in two_procs[0][agent]["metrics"].values())


@pytest.mark.parametrize("agent", ["sac", "crl_global"])
def test_two_processes_equal_one_device(runs, agent):
    """The data-parallel update over 2 processes is the 1-device update of the whole batch, up to
    float summation order (the pmean of two half-batch gradients vs one full-batch mean; for CRL, with
    the representations all-gathered so that every row's negatives are the global batch)."""
    two_procs, _, one_device = runs
    assert (one_device[agent]["devices"], one_device[agent]["processes"]) == (1, 1)
    for key in ("sum", "abs"):
        np.testing.assert_allclose(two_procs[0][agent][key], one_device[agent][key], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(list(two_procs[0][agent]["metrics"].values()),
                               list(one_device[agent]["metrics"].values()), rtol=1e-3, atol=1e-4)


def test_crl_per_device_negatives_are_another_loss_than_one_device(runs):
    """CRL's default InfoNCE contrasts each row with its device's B/n goals only, so 2 devices (or
    processes) train on another loss than 1 device: the critic loss differs by far more than the float
    order that separates the global-negatives run from 1 device."""
    two_procs, one_proc, one_device = runs
    crit = lambda r, a: r[a]["metrics"]["loss/critic"]  # noqa: E731
    local_gap = abs(crit(two_procs[0], "crl") - crit(one_device, "crl"))
    global_gap = abs(crit(two_procs[0], "crl_global") - crit(one_device, "crl_global"))
    assert local_gap > 0.05 and local_gap > 1e3 * global_gap, (local_gap, global_gap)
    # on 1 device the two CRL variants are the same program up to the gather of 1 shard
    np.testing.assert_allclose(one_device["crl"]["sum"], one_device["crl_global"]["sum"], rtol=1e-6, atol=1e-6)


def test_crl_global_negatives_gradient_is_the_whole_batch_gradient(runs):
    """The contrastive loss alone (symmetric InfoNCE, linear encoders): with global negatives the
    data-parallel gradient (all-gather forward, its reduce-scatter backward, pmean) is the whole-batch
    gradient on 2 processes, 2 devices and 1 device (Adam, which the agent uses, would hide a constant
    factor); with per-device negatives it differs on 2 devices."""
    two_procs, one_proc, one_device = runs
    for r in two_procs + [one_proc, one_device]:
        g = r["contrastive_grad"]
        assert g["scale"] > 0.05 and g["global"]["vs_single"] <= 1e-5 * g["scale"] + 1e-7, g
    for r in two_procs + [one_proc]:
        assert r["contrastive_grad"]["local"]["vs_single"] > 1e-2 * r["contrastive_grad"]["scale"]
    assert one_device["contrastive_grad"]["local"]["vs_single"] <= 1e-7
    np.testing.assert_allclose(np.concatenate(two_procs[0]["contrastive_grad"]["global"]["grad"]),
                               np.concatenate(one_device["contrastive_grad"]["global"]["grad"]), rtol=1e-5, atol=1e-7)


def test_zero1_over_two_processes_equals_the_replicated_update(runs):
    """ZeRO-1 (scaling_rl/zero.py) with the mesh spanning 2 processes: each process keeps half of the
    optimiser state, and the update equals the replicated one (and that of 1 process x 2 devices)."""
    two_procs, one_proc, _ = runs
    for r in two_procs + [one_proc]:
        z = r["zero"]
        assert z["change"] > 1e-2 and z["vs_replicated"] <= 1e-6, z
    # momentum of b (3,: no even axis, kept whole per process), s (scalar: replicated), w (8x3: halves)
    assert two_procs[0]["zero"]["state_shapes"] == [[[6], [3]], [[], []], [[8, 3], [4, 3]]]
    assert two_procs[0]["zero"]["params"] == two_procs[1]["zero"]["params"]
    np.testing.assert_allclose(np.concatenate([np.ravel(x) for x in two_procs[0]["zero"]["params"]]),
                               np.concatenate([np.ravel(x) for x in one_proc["zero"]["params"]]), rtol=0, atol=1e-7)

"""One learner over several JAX processes (gloo CPU collectives, coordinator on localhost) computes what
one process with the same number of devices computes: the data-parallel mesh spans processes unchanged
(issue 24, part 1), and what one process with one device computes, to float summation order."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from scaling_rl.multiprocess import free_port

CHECK = Path(__file__).with_name("multiprocess_check.py")


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


@pytest.mark.parametrize("agent", ["sac"])
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


@pytest.mark.parametrize("agent", ["sac"])
def test_two_processes_equal_one_device(runs, agent):
    """The data-parallel update over 2 processes is the 1-device update of the whole batch, up to
    float summation order (the pmean of two half-batch gradients vs one full-batch mean)."""
    two_procs, _, one_device = runs
    assert (one_device[agent]["devices"], one_device[agent]["processes"]) == (1, 1)
    for key in ("sum", "abs"):
        np.testing.assert_allclose(two_procs[0][agent][key], one_device[agent][key], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(list(two_procs[0][agent]["metrics"].values()),
                               list(one_device[agent]["metrics"].values()), rtol=1e-3, atol=1e-4)


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

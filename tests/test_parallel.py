"""Data-parallel update over 8 forced CPU devices equals the 1-device update on the same global batch.

The 8-device check runs in a subprocess (tests/parallel_check.py) because the device count is fixed
when jax is first imported."""
import jax
import pytest
from forced_devices import run_check

from scaling_rl import parallel


@pytest.fixture(scope="module")
def eight_devices():
    return run_check("parallel_check.py")


def test_eight_forced_devices(eight_devices):
    assert eight_devices["devices"] == 8
    assert eight_devices["mesh"] == {"data": 8}


@pytest.mark.parametrize("algo", ["sac", "dqn"])
def test_sharded_update_equals_single_device(eight_devices, algo):
    r = eight_devices[algo]
    assert r["change"] > 1e-6  # the update did something
    assert r["params"] <= 1e-5 * max(1.0, r["scale"]), r
    assert r["metrics"] <= 1e-4, r


def test_sharded_chunk_with_vmapped_seeds_matches(eight_devices):
    r = eight_devices["chunk"]
    assert r["grad_steps"] == 32
    assert r["params"] <= 1e-4 * max(1.0, r["scale"]), r


def test_make_mesh_and_seed_keys():
    mesh = parallel.make_mesh(1)
    assert mesh.shape == {"data": 1} and parallel.mesh_size(mesh) == 1 and parallel.mesh_size(None) == 1
    with pytest.raises(ValueError, match="^n_devices"):
        parallel.make_mesh(jax.device_count() + 1)
    keys = parallel.seed_keys(0, 4)
    assert keys.shape[0] == 4 and len({tuple(map(int, k)) for k in keys}) == 4

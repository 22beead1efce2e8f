"""What a user bringing a pretrained model and a GPU hits (issue 20), reproduced on the CPU: mixed
JAX device placement (two forced host devices), memory of the log-prob passes on a real vocabulary
size, defaults that would change a pretrained model, token budgets, the Ray source's placement."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from scaling_rl.llm import rollout  # noqa: E402
from scaling_rl.llm.trainer import GRPOConfig, GRPOTrainer  # noqa: E402

torch.set_num_threads(1)
TINY = dict(sft_steps=0, prompts_per_step=2, group_size=2, eval_problems=4, train_pool=16,
            hidden_size=32, num_heads=2)


@pytest.fixture(scope="module")
def trainer():
    t = GRPOTrainer(GRPOConfig(**TINY))
    t.setup()
    yield t
    t.close()


# ---- 1. JAX on the GPU: every objective input where the objective runs -------------------------

class _Recorded(Exception):
    pass


def test_every_objective_input_is_on_the_objective_device(trainer):
    """With CUDA JAX the objective runs on the GPU; an input left on the host (num_items was
    `mask.sum().cpu()`) is committed there and the jitted objective raises. A fake objective device
    (meta) shows where each input is sent."""
    data = trainer.collect()
    seen = []

    def spy(*args):
        seen.extend(a.device if isinstance(a, torch.Tensor) else type(a).__name__ for a in args)
        raise _Recorded

    saved = trainer._objective_device, trainer.objective
    trainer._objective_device, trainer.objective = torch.device("meta"), spy
    try:
        with pytest.raises(_Recorded):
            trainer._update(data["batch"], data["rewards"])
    finally:
        trainer._objective_device, trainer.objective = saved
        trainer.model.eval()
    assert len(seen) == 6 and seen[-1] == "float"
    assert all(d == torch.device("meta") for d in seen[:-1]), seen


def test_mixed_placement_with_two_forced_devices_and_no_preallocation():
    """Two forced JAX host devices: the objective's inputs committed to device 1 (JAX's GPU) and
    num_items committed to device 0 (the host) fail; a Python number goes where the inputs are.
    Importing the LLM package turns JAX's GPU preallocation off (torch shares the card)."""
    code = textwrap.dedent("""
        import os
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
        os.environ["JAX_PLATFORMS"] = "cpu"
        os.environ.pop("XLA_PYTHON_CLIENT_PREALLOCATE", None)
        import scaling_rl.llm
        assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
        import jax, jax.numpy as jnp
        from scaling_rl.llm import objectives
        d0, d1 = jax.devices()
        fn = jax.jit(objectives.objective_fn("dapo", 0.2, 0.2, 0.0, 3))
        x = jax.device_put(jnp.full((2, 3), -1.0), d1)
        args = (x, x, x, jax.device_put(jnp.ones(2), d1), jax.device_put(jnp.ones((2, 3)), d1))
        try:
            fn(*args, jax.device_put(jnp.float32(6), d0))
            print("MIXED_OK")
        except ValueError as e:
            assert "incompatible devices" in str(e) or "device" in str(e), e
            print("MIXED_RAISES")
        loss, _ = fn(*args, 6.0)
        assert loss.devices() == {d1}, loss.devices()
        print("FLOAT_OK")
    """)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["MIXED_RAISES", "FLOAT_OK"]

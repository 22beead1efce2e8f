"""Run a check script in a fresh Python (the device count is fixed when jax is first imported, so each
forced-device check runs where XLA_FLAGS is set before that import) and return its last stdout line as JSON."""
import json
import os
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent


def run_check(script: str, timeout: float = 900, **extra_env: str) -> dict:
    env = dict(os.environ)
    # the check sets its own device count; other flags (conftest's optimisation level) pass through
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
    env["XLA_FLAGS"] = " ".join(flags)
    env["JAX_PLATFORMS"] = "cpu"
    env.update(extra_env)
    proc = subprocess.run([sys.executable, str(HERE / script)], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=HERE.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])

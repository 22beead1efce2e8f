"""Run a check script in a fresh Python (the device count is fixed when jax is first imported, so each
forced-device check runs where XLA_FLAGS is set before that import) and return its last stdout line as JSON."""
import json
import os
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent


DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


def xla_flags(devices: int | None = None) -> str:
    """This process's $XLA_FLAGS for a child: any forced device count replaced by `devices` (dropped
    when None: the check script sets its own); other flags (conftest's optimisation level) kept."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(DEVICE_COUNT_FLAG)]
    return " ".join(flags + ([f"{DEVICE_COUNT_FLAG}={devices}"] if devices else []))


def run_check(script: str, timeout: float = 900, **extra_env: str) -> dict:
    env = dict(os.environ, XLA_FLAGS=xla_flags())
    env["JAX_PLATFORMS"] = "cpu"
    env.update(extra_env)
    proc = subprocess.run([sys.executable, str(HERE / script)], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=HERE.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])

#!/usr/bin/env bash
# Prepared GPU check for CRL (one H200; budget <= 10 minutes wall, each section under its own timeout).
#   1. CRL on a goal-conditioned brax task at encoder depth 4 / 64 / 256 (paper-like settings:
#      512 envs, utd 1/40, batch 512, width 256): compile time of one chunk and env-steps/s
#      including the gradient updates.
#   2. CRL backbone forward+backward at width 2048 in bfloat16 (scanned stack): step time, achieved
#      TFLOP/s and model-FLOPs utilisation against the H200's ~790 TFLOP/s dense bf16 peak.
# Usage:  bash benchmarks/gpu_crl.sh                 (GPU)
#         GPU_CRL_DRY=1 bash benchmarks/gpu_crl.sh   (CPU smoke: tiny sizes, point maze; checks the code runs)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
export XLA_PYTHON_CLIENT_PREALLOCATE=${XLA_PYTHON_CLIENT_PREALLOCATE:-false}
DRY=${GPU_CRL_DRY:-0}
ENV_NAME=${GPU_CRL_ENV:-goal/ant}
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
"$PY" -c "import jax; print('jax', jax.__version__, jax.devices())"

echo "== 1. CRL env-steps/s and compile time vs depth ($ENV_NAME) =="
GPU_CRL_DRY=$DRY GPU_CRL_ENV=$ENV_NAME timeout 420 "$PY" - <<'PY' || echo "section 1 failed or timed out (rc=$?)"
import os, time
import jax
from scaling_rl.agents import crl

dry = os.environ.get("GPU_CRL_DRY") == "1"
env = "point_maze/u_maze" if dry else os.environ["GPU_CRL_ENV"]
depths = (4, 8) if dry else (4, 64, 256)
n_envs, batch, width = (16, 32, 32) if dry else (512, 512, 256)
utd = 1 / 16 if dry else 1 / 40                       # paper: ~1 gradient step per 40 env steps
chunk = n_envs * (80 if dry else 100)                  # 100 vector steps = 51,200 env steps, 1,280 updates
for depth in depths:
    cfg = crl.Config(env=env, num_envs=n_envs, utd=utd, batch_size=batch, width=width, depth=depth,
                     actor_width=width, actor_depth=4, chunk_env_steps=chunk, learning_starts=n_envs * 4,
                     env_steps=n_envs * 4 + 3 * chunk, buffer_size=n_envs * 1000, eval_episodes=8,
                     episode_length=50 if dry else 1000)
    agent = crl.make(cfg)
    abstract = jax.eval_shape(agent.init, jax.random.PRNGKey(0))
    t0 = time.perf_counter()
    step = jax.jit(agent.chunk, donate_argnums=0).lower(abstract).compile()
    compile_s = time.perf_counter() - t0
    state = jax.jit(agent.init)(jax.random.PRNGKey(0))
    state, m = step(state)
    jax.block_until_ready(m)
    t0 = time.perf_counter()
    state, m = step(state)
    jax.block_until_ready(m)
    secs = time.perf_counter() - t0
    print(f"depth {depth:4d}  N={agent.param_count:>12,}  compile {compile_s:6.1f} s  "
          f"env-steps/s {chunk / secs:10.0f}  updates/s {chunk * utd / secs:8.1f}  "
          f"loss/critic {float(m['loss/critic']):.3f}", flush=True)
PY

echo "== 2. CRL backbone fwd+bwd, width 2048, bfloat16 =="
GPU_CRL_DRY=$DRY timeout 150 "$PY" - <<'PY' || echo "section 2 failed or timed out (rc=$?)"
import os, time
import jax, jax.numpy as jnp
from scaling_rl import nets

dry = os.environ.get("GPU_CRL_DRY") == "1"
PEAK = 790e12                                          # H200 dense bf16 FLOP/s (approx.)
width, batch, in_dim = (64, 64, 32) if dry else (2048, 4096, 64)
for depth in ((4, 8) if dry else (16, 64)):
    cfg = nets.BackboneConfig(kind="crl", width=width, depth=depth, compute_dtype="bfloat16")
    net = nets.Backbone(cfg)
    x = jax.random.normal(jax.random.PRNGKey(0), (batch, in_dim))
    params = net.init(jax.random.PRNGKey(1), x)

    @jax.jit
    def fwd_bwd(params, x):
        return jax.grad(lambda p: jnp.mean(jnp.square(net.apply(p, x))))(params)

    t0 = time.perf_counter()
    jax.block_until_ready(fwd_bwd(params, x))
    compile_s = time.perf_counter() - t0
    n = 3 if dry else 20
    t0 = time.perf_counter()
    for _ in range(n):
        g = fwd_bwd(params, x)
    jax.block_until_ready(g)
    secs = (time.perf_counter() - t0) / n
    flops = 3 * nets.backbone_flops(cfg, in_dim) * batch   # forward + backward (2x forward)
    print(f"depth {depth:3d}  width {width}  batch {batch}  compile {compile_s:5.1f} s  step {secs * 1e3:8.2f} ms  "
          f"{flops / secs / 1e12:7.1f} TFLOP/s  MFU {flops / secs / PEAK:6.1%}", flush=True)
PY
echo "done"

#!/usr/bin/env bash
# Prepared GPU check for CRL (one H200; budget <= 10 minutes wall, each section under its own timeout).
#   1. The CPU table of benchmarks/crl_throughput.py in bfloat16: one CRL update (width 256, batch 256)
#      ours vs the unrolled reference at depth 16/64/128/256, step-time ratio and peak memory
#      (target >= 1.0 at every depth; the unrolled side only where it compiles within 90 s).
#   2. Launch -> first trained chunk on brax goal/ant at depth 64 (paper-like settings: 512 envs,
#      utd 1/40, batch 512, width 256): seconds from process start to the first chunk's metrics,
#      the chunk's compile time, and env-steps/s including the gradient updates.
#   3. CRL backbone forward+backward at width 2048 in bfloat16 (scanned stack): step time and MFU.
#      MFU = matmul FLOPs / (time x 989e12), the H200's dense BF16 peak; only matmul FLOPs count
#      (backbone_flops_breakdown()["matmul"]: forward, dW of every Dense, dX of every Dense but the
#      input one, which is not differentiated), so elementwise work never flatters it.
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

echo "== 1. CRL update ours vs unrolled, bfloat16 =="
if [ "$DRY" = 1 ]; then
  T1=(--depths 4,8 --width 16 --batch-size 16 --repeats 2 --unrolled-compile-limit 60)
else
  T1=(--depths 16,64,128,256 --width 256 --batch-size 256 --repeats 20 --unrolled-compile-limit 90)
fi
timeout 300 "$PY" benchmarks/crl_throughput.py --compute-dtype bfloat16 "${T1[@]}" \
  || echo "section 1 failed or timed out (rc=$?)"

echo "== 2. launch -> first trained chunk, $ENV_NAME, depth 64 =="
GPU_CRL_DRY=$DRY GPU_CRL_ENV=$ENV_NAME LAUNCH_T0=$(date +%s.%N) timeout 200 "$PY" - <<'PY' || echo "section 2 failed or timed out (rc=$?)"
import os, time
t_launch = float(os.environ["LAUNCH_T0"])
import jax
from scaling_rl.agents import crl

dry = os.environ.get("GPU_CRL_DRY") == "1"
env = "point_maze/u_maze" if dry else os.environ["GPU_CRL_ENV"]
n_envs, batch, width, depth = (16, 32, 32, 8) if dry else (512, 512, 256, 64)
utd = 1 / 16 if dry else 1 / 40                       # paper: ~1 gradient step per 40 env steps
chunk = n_envs * (80 if dry else 100)                  # 100 vector steps = 51,200 env steps, 1,280 updates
cfg = crl.Config(env=env, num_envs=n_envs, utd=utd, batch_size=batch, width=width, depth=depth,
                 actor_width=width, actor_depth=depth, chunk_env_steps=chunk, learning_starts=n_envs * 4,
                 env_steps=n_envs * 4 + 3 * chunk, buffer_size=n_envs * 1000, eval_episodes=8,
                 episode_length=50 if dry else 1000)
agent = crl.make(cfg)
t0 = time.perf_counter()
step = jax.jit(agent.chunk, donate_argnums=0).lower(jax.eval_shape(agent.init, jax.random.PRNGKey(0))).compile()
compile_s = time.perf_counter() - t0
state = jax.jit(agent.init)(jax.random.PRNGKey(0))
state, m = step(state)
jax.block_until_ready(m)
first = time.time() - t_launch
t0 = time.perf_counter()
state, m = step(state)
jax.block_until_ready(m)
secs = time.perf_counter() - t0
print(f"depth {depth}  N={agent.param_count:,}  launch->first chunk {first:6.1f} s  (chunk compile {compile_s:.1f} s)  "
      f"env-steps/s {chunk / secs:10.0f}  updates/s {chunk * utd / secs:8.1f}  loss/critic {float(m['loss/critic']):.3f}",
      flush=True)
PY

echo "== 3. CRL backbone fwd+bwd, width 2048, bfloat16, MFU vs 989 TFLOP/s =="
GPU_CRL_DRY=$DRY timeout 100 "$PY" - <<'PY' || echo "section 3 failed or timed out (rc=$?)"
import os, time
import jax, jax.numpy as jnp
from scaling_rl import nets

dry = os.environ.get("GPU_CRL_DRY") == "1"
PEAK = 989e12                                          # H200 SXM dense BF16 FLOP/s
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
    matmul = nets.backbone_flops_breakdown(cfg, in_dim)["matmul"]        # forward, per sample
    flops = (3 * matmul - 2 * in_dim * width) * batch                   # + dW all, + dX all but input
    print(f"depth {depth:3d}  width {width}  batch {batch}  compile {compile_s:5.1f} s  step {secs * 1e3:8.2f} ms  "
          f"{flops / secs / 1e12:7.1f} matmul TFLOP/s  MFU {flops / secs / PEAK:6.1%}", flush=True)
PY
echo "done"

"""CRL throughput: our agent (scanned residual stacks) vs an unrolled-loop reference network.

The reference encoder/actor are written the way the paper's code writes them: a Python `for` loop over
residual blocks (each 4 x Dense -> LayerNorm -> swish, then the skip), float32, so XLA sees every layer
separately. Both run inside the same agent loop (env steps + hindsight replay + updates), with the same
config, in the same process, measured interleaved (median over repeats) so machine load hits both.

Prints env-steps/s (including the gradient updates) at each depth, compile times of one jitted chunk,
the compile time of both at --compile-depth (256 by default), and as the final line
`speedup_vs_unrolled_depth64=<x>` (ours / reference env-steps/s at depth 64).

    python benchmarks/crl_throughput.py                  # CPU-sized defaults, a few minutes
    python benchmarks/crl_throughput.py --width 256 --batch-size 256 --num-envs 256   # GPU
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp

from scaling_rl import nets
from scaling_rl.agents import crl


class UnrolledEncoder(nn.Module):
    """Paper-style encoder: Dense-LN-swish, then depth/4 residual blocks unrolled by Python, head."""

    backbone: nets.BackboneConfig
    repr_dim: int

    @nn.compact
    def __call__(self, x):
        w = self.backbone.width
        x = nn.swish(nn.LayerNorm()(nn.Dense(w)(x)))
        for _ in range(self.backbone.depth // 4):
            skip = x
            for _ in range(4):
                x = nn.swish(nn.LayerNorm()(nn.Dense(w)(x)))
            x = x + skip
        return nn.Dense(self.repr_dim)(x)


class UnrolledActor(nn.Module):
    """Paper-style actor over the same unrolled stack; Gaussian mean and bounded log-std."""

    backbone: nets.BackboneConfig
    action_dim: int

    @nn.compact
    def __call__(self, obs):
        h = UnrolledEncoder(self.backbone, 2 * self.action_dim)(obs)
        mean, raw = jnp.split(h, 2, axis=-1)
        log_std = crl.LOG_STD_MIN + 0.5 * (crl.LOG_STD_MAX - crl.LOG_STD_MIN) * (jnp.tanh(raw) + 1.0)
        return mean, log_std


IMPLS = {"ours": {}, "unrolled": {"encoder_cls": UnrolledEncoder, "actor_cls": UnrolledActor}}


def config(args, depth: int) -> crl.Config:
    return crl.Config(env=args.env, num_envs=args.num_envs, utd=args.utd, batch_size=args.batch_size,
                      width=args.width, depth=depth, actor_width=args.width, actor_depth=depth,
                      chunk_env_steps=args.chunk_env_steps, learning_starts=args.num_envs * 4,
                      env_steps=args.num_envs * 4 + args.chunk_env_steps * 100,
                      buffer_size=args.num_envs * 1024, eval_episodes=8, compute_dtype=args.compute_dtype)


def compile_chunk(agent):
    """Seconds to lower + compile one chunk (from abstract shapes: nothing is run)."""
    abstract = jax.eval_shape(agent.init, jax.random.PRNGKey(0))
    t0 = time.perf_counter()
    compiled = jax.jit(agent.chunk, donate_argnums=0).lower(abstract).compile()
    return compiled, time.perf_counter() - t0


def throughput(args, depth: int) -> dict[str, float]:
    cfg = config(args, depth)
    runs, compile_s = {}, {}
    for name, networks in IMPLS.items():
        agent = crl.make(cfg, **networks)
        compiled, compile_s[name] = compile_chunk(agent)
        state = jax.jit(agent.init)(jax.random.PRNGKey(0))
        state, m = compiled(state)                     # warm-up chunk
        jax.block_until_ready(m)
        runs[name] = [compiled, state, []]
    for _ in range(args.repeats):                      # interleaved: machine load hits both alike
        for name, run in runs.items():
            compiled, state, times = run
            t0 = time.perf_counter()
            state, m = compiled(state)
            jax.block_until_ready(m)
            times.append(time.perf_counter() - t0)
            run[1] = state
    sps = {name: cfg.chunk_env_steps / statistics.median(run[2]) for name, run in runs.items()}
    for name in IMPLS:
        print(f"depth {depth:4d}  {name:9s} env-steps/s {sps[name]:10.0f}  (incl. "
              f"{cfg.chunk_env_steps * cfg.utd:.0f} updates/chunk)  compile {compile_s[name]:6.1f} s")
    return sps


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="point_maze/u_maze")
    p.add_argument("--depths", default="4,64")
    p.add_argument("--compile-depth", type=int, default=256, help="0 skips the compile-time comparison")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--num-envs", type=int, default=64)
    p.add_argument("--utd", type=float, default=0.0625)
    p.add_argument("--chunk-env-steps", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--compute-dtype", default="float32", help="ours only sets the backbone dtype")
    p.add_argument("--compile-timeout", type=float, default=600.0, help="seconds per depth-256 compile")
    p.add_argument("--compile-only", choices=tuple(IMPLS), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.compile_only:
        depth = int(args.depths.split(",")[0])
        _, secs = compile_chunk(crl.make(config(args, depth), **IMPLS[args.compile_only]))
        print(f"compile_s={secs}")
        return
    print(f"backend {jax.default_backend()} · env {args.env} · width {args.width} · batch {args.batch_size} "
          f"· envs {args.num_envs} · utd {args.utd} · chunk {args.chunk_env_steps} env steps")
    speedup = {}
    for depth in (int(d) for d in args.depths.split(",")):
        sps = throughput(args, depth)
        speedup[depth] = sps["ours"] / sps["unrolled"]
        print(f"depth {depth:4d}  speedup ours/unrolled {speedup[depth]:.2f}x")
    if args.compile_depth:
        # each in a child process with a time limit: the unrolled compile can take many minutes
        for name in IMPLS:
            cmd = [sys.executable, __file__, "--compile-only", name, "--depths", str(args.compile_depth),
                   *_forward(args)]
            t0 = time.perf_counter()
            try:
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.compile_timeout)
                line = [x for x in out.stdout.splitlines() if x.startswith("compile_s=")]
                secs = f"{float(line[-1].split('=')[1]):7.1f} s" if line else f"failed: {out.stderr[-300:]}"
            except subprocess.TimeoutExpired:
                secs = f"> {time.perf_counter() - t0:.0f} s (stopped at --compile-timeout)"
            print(f"compile depth {args.compile_depth}: {name:9s} {secs}", flush=True)
    print(f"speedup_vs_unrolled_depth64={speedup.get(64, float('nan')):.2f}")


def _forward(args) -> list[str]:
    return ["--env", args.env, "--width", str(args.width), "--batch-size", str(args.batch_size),
            "--num-envs", str(args.num_envs), "--utd", str(args.utd),
            "--chunk-env-steps", str(args.chunk_env_steps), "--compute-dtype", args.compute_dtype]


if __name__ == "__main__":
    main()

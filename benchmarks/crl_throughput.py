"""CRL update step: our agent (scanned residual stacks) vs an unrolled-loop reference network.

One update = `crl.make(cfg).update`: InfoNCE critic (φ(s, a), ψ(g)) + actor through φ + α, Adam, on
one relabelled batch. The reference encoder/actor are written the way the paper's code writes them: a
Python `for` loop over residual blocks (each 4 x Dense -> LayerNorm -> swish, then the skip), float32,
so XLA sees every layer separately. Both are the same agent (`crl.make(cfg, encoder_cls=...)`), timed
in the same process, interleaved (median over repeats), so machine load hits both alike.

The unrolled update's compile time grows linearly with depth (minutes at 256), so it is compiled in a
child process under `--unrolled-compile-limit` seconds that writes a private persistent compilation
cache; this process then loads it from there. Where the child runs out of time the row says so and the
unrolled side is not measured. Peak memory is XLA's own buffer assignment of the compiled update
(arguments + outputs + temporaries − aliased), i.e. what one update needs on the device.

How the run-time gap was found (docs/deep_stacks.md has the numbers): `--hlo` prints, for each while
loop of our compiled update, how many depth-stacked (num_blocks, ...) buffers it carries and their
bytes, from `jax.jit(update).lower(...).compile().as_text()`. Before the fix the forward loop of each
encoder wrote 7 (batch, width) arrays per Dense into stacked buffers (what JAX's scan saves for the
backward); with `nets.backbone.SCAN_SAVE_POLICY` it writes the matmul outputs only.

    .venv/bin/python benchmarks/crl_throughput.py                       # depths 16,64,128,256, CPU
    .venv/bin/python benchmarks/crl_throughput.py --depths 1024 --no-unrolled --memory-only
    .venv/bin/python benchmarks/crl_throughput.py --compute-dtype bfloat16  # GPU (benchmarks/gpu/run.sh, section b)

Last line: `min_speedup_vs_unrolled=<x>` = min over measured depths of unrolled / ours step time.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import flax.linen as nn
import jax
import jax.numpy as jnp

from scaling_rl import envs, nets
from scaling_rl.agents import crl


class UnrolledEncoder(nn.Module):
    """Paper-style encoder: Dense-LN-swish, then depth/4 residual blocks unrolled by Python, head."""

    backbone: nets.BackboneConfig
    repr_dim: int

    @nn.compact
    def __call__(self, x):
        w = self.backbone.width
        dtype = nets.backbone.COMPUTE_DTYPES[self.backbone.compute_dtype]
        x = nn.swish(nn.LayerNorm()(nn.Dense(w, dtype=dtype)(x).astype(jnp.float32)))
        for _ in range(self.backbone.depth // 4):
            skip = x
            for _ in range(4):
                x = nn.swish(nn.LayerNorm()(nn.Dense(w, dtype=dtype)(x).astype(jnp.float32)))
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
    return crl.Config(env=args.env, num_envs=16, utd=0.0625, batch_size=args.batch_size,
                      width=args.width, depth=depth, actor_width=args.width, actor_depth=depth,
                      chunk_env_steps=256, learning_starts=16, env_steps=16 + 256, buffer_size=16 * 4,
                      eval_episodes=1, compute_dtype=args.compute_dtype, remat=args.remat)


def dims(cfg: crl.Config) -> tuple[int, int, int]:
    """(state_dim, goal_dim, action_dim) of the env's relabelled batches."""
    env = envs.make(cfg.env, num_envs=1)
    return env.goal_spec.state_dim, env.goal_spec.goal_dim, env.spec.action_dim


def update_inputs(agent, cfg: crl.Config):
    """Abstract (learner, batch, key) of one update: nothing is initialised."""
    learner = jax.eval_shape(agent.init, jax.random.PRNGKey(0)).learner
    (s, g, a), b = dims(cfg), cfg.batch_size
    batch = {"state": jax.ShapeDtypeStruct((b, s), jnp.float32),
             "action": jax.ShapeDtypeStruct((b, a), jnp.float32),
             "goal": jax.ShapeDtypeStruct((b, g), jnp.float32)}
    return learner, batch, jax.ShapeDtypeStruct((2,), jnp.uint32)


def compile_update(agent, cfg):
    """Lower + compile one jitted update from abstract shapes; returns (compiled, seconds)."""
    t0 = time.perf_counter()
    compiled = jax.jit(agent.update, donate_argnums=0).lower(*update_inputs(agent, cfg)).compile()
    return compiled, time.perf_counter() - t0


def peak_bytes(compiled) -> int:
    """XLA's buffer assignment of one call: arguments + outputs + temporaries - donated/aliased."""
    m = compiled.memory_analysis()
    return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
               - m.alias_size_in_bytes)


def concrete_inputs(agent, cfg):
    # eagerly: a jitted init of the unrolled networks is itself a program that grows with depth
    learner = agent.init(jax.random.PRNGKey(0)).learner
    (s, g, a), b = dims(cfg), cfg.batch_size
    k = jax.random.split(jax.random.PRNGKey(1), 3)
    batch = {"state": jax.random.normal(k[0], (b, s)),
             "action": jax.random.uniform(k[1], (b, a), minval=-1, maxval=1),
             "goal": jax.random.normal(k[2], (b, g))}
    return learner, batch, jax.random.PRNGKey(2)


def child_compile(args, depth: int, cache_dir: str) -> str:
    """Compile the unrolled update in a child under the time limit; '' when it finished, else why not."""
    cmd = [sys.executable, __file__, "--compile-only", "--depths", str(depth), *_forward(args)]
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": cache_dir,
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.unrolled_compile_limit, env=env)
    except subprocess.TimeoutExpired:
        return f"compile > {args.unrolled_compile_limit:.0f} s limit"
    return "" if out.returncode == 0 else f"compile failed: {out.stderr.strip().splitlines()[-1:]}"


def measure(args, depth: int, cache_dir: str) -> dict:
    cfg = config(args, depth)
    row = {"depth": depth, "params": None}
    runs = {}
    for name in IMPLS:
        if name == "unrolled":
            if args.no_unrolled:
                row["unrolled_note"] = "not run (--no-unrolled)"
                continue
            t0 = time.perf_counter()
            why = child_compile(args, depth, cache_dir)
            row["unrolled_child_s"] = time.perf_counter() - t0
            if why:
                row["unrolled_note"] = why
                continue
        agent = crl.make(cfg, **IMPLS[name])
        if name == "ours":
            row["params"] = agent.param_count
        compiled, secs = compile_update(agent, cfg)
        row[f"{name}_compile_s"] = row.get("unrolled_child_s", secs) if name == "unrolled" else secs
        row[f"{name}_peak"] = peak_bytes(compiled)
        if args.memory_only:
            continue
        learner, batch, key = concrete_inputs(agent, cfg)
        learner, aux = compiled(learner, batch, key)     # warm-up
        jax.block_until_ready(aux)
        runs[name] = [compiled, learner, batch, key, [], []]
    for _ in range(args.repeats):                        # interleaved: machine load hits both alike
        for run in runs.values():
            compiled, learner, batch, key, times, cpu = run
            t0, c0 = time.perf_counter(), time.process_time()
            learner, aux = compiled(learner, batch, key)
            jax.block_until_ready((learner, aux))
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            run[1] = learner
    for name, run in runs.items():
        row[f"{name}_step_s"] = statistics.median(run[4])
        row[f"{name}_cpu_s"] = statistics.median(run[5])
    if "ours_step_s" in row and "unrolled_step_s" in row:
        row["ratio"] = row["unrolled_step_s"] / row["ours_step_s"]
        # CPU seconds of this process per step: less sensitive to other processes on a shared box
        row["cpu_ratio"] = row["unrolled_cpu_s"] / row["ours_cpu_s"]
    return row


def print_table(rows: list[dict], args) -> None:
    print(f"\nCRL update, backend {jax.default_backend()}, width {args.width}, batch {args.batch_size}, "
          f"{args.compute_dtype}, remat={args.remat}; ratio = unrolled / ours step time (> 1: ours faster)")
    head = ["depth", "params", "ours step ms", "unrolled step ms", "ratio", "cpu-time ratio", "ours compile s",
            "unrolled compile s", "ours peak MiB", "unrolled peak MiB"]
    body = []
    for r in rows:
        ms = lambda k: f"{r[k] * 1e3:.1f}" if k in r else "-"          # noqa: E731
        sec = lambda k: f"{r[k]:.1f}" if k in r else "-"               # noqa: E731
        mib = lambda k: f"{r[k] / 2 ** 20:.0f}" if k in r else "-"     # noqa: E731
        body.append([str(r["depth"]), f"{r['params']:,}", ms("ours_step_s"), ms("unrolled_step_s"),
                     f"{r['ratio']:.2f}" if "ratio" in r else "-",
                     f"{r['cpu_ratio']:.2f}" if "cpu_ratio" in r else "-", sec("ours_compile_s"),
                     sec("unrolled_compile_s") if "unrolled_compile_s" in r else r.get("unrolled_note", "-"),
                     mib("ours_peak"), mib("unrolled_peak")])
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    print("  ".join(h.rjust(w) for h, w in zip(head, widths)))
    for b in body:
        print("  ".join(c.rjust(w) for c, w in zip(b, widths)), flush=True)


def hlo_report(args) -> None:
    """Stacked buffers per while loop of our compiled update, with and without the save policy."""
    depth = int(args.depths.split(",")[0])
    cfg = config(args, depth)
    nb = depth // 4
    print(f"while loops of our compiled update at depth {depth} (num_blocks {nb}); each: "
          "[stacked arrays carried, MiB]")
    for label, policy in (("save everything (before)", None),
                          ("SCAN_SAVE_POLICY (now)", nets.backbone.SCAN_SAVE_POLICY)):
        saved = nets.backbone.SCAN_SAVE_POLICY
        nets.backbone.SCAN_SAVE_POLICY = policy
        try:
            compiled, _ = compile_update(crl.make(cfg), cfg)
        finally:
            nets.backbone.SCAN_SAVE_POLICY = saved
        loops = nets.memory.while_loop_stacked_buffers(compiled.as_text(), nb)
        print(f"  {label:26s} peak {peak_bytes(compiled) / 2 ** 20:8.0f} MiB  loops "
              + " ".join(f"[{n}, {b / 2 ** 20:.0f}]" for n, b in loops))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="point_maze/u_maze")
    p.add_argument("--depths", default="16,64,128,256")
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--compute-dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--remat", action="store_true", help="our stacks rematerialise each block")
    p.add_argument("--unrolled-compile-limit", type=float, default=240.0,
                   help="seconds the unrolled update may take to compile (in a child process)")
    p.add_argument("--no-unrolled", action="store_true", help="measure ours only")
    p.add_argument("--memory-only", action="store_true", help="compile and report peak memory; run nothing")
    p.add_argument("--hlo", action="store_true", help="print the while-loop buffer report and exit")
    p.add_argument("--compile-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    depths = [int(d) for d in args.depths.split(",")]
    for d in depths:
        if d < 4 or d % 4:
            p.error(f"--depths: {d} is not a positive multiple of 4 (one CRL block = 4 Dense)")
    if args.compile_only:                                 # child of child_compile
        cfg = config(args, depths[0])
        compile_update(crl.make(cfg, **IMPLS["unrolled"]), cfg)
        return
    if args.hlo:
        hlo_report(args)
        return
    rows = []
    cache = tempfile.TemporaryDirectory(prefix="crl_throughput_cache_")
    # the unrolled update is compiled by a child under a time limit into this cache, then loaded here
    jax.config.update("jax_compilation_cache_dir", cache.name)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    with cache as cache_dir:
        for depth in depths:
            rows.append(measure(args, depth, cache_dir))
            r = rows[-1]
            print(f"depth {depth}: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                                 for k, v in r.items() if k != "depth"), flush=True)
    print_table(rows, args)
    ratios = [r["ratio"] for r in rows if "ratio" in r]
    print(f"min_speedup_vs_unrolled={min(ratios):.2f}" if ratios else "min_speedup_vs_unrolled=nan")


def _forward(args) -> list[str]:
    return ["--env", args.env, "--width", str(args.width), "--batch-size", str(args.batch_size),
            "--compute-dtype", args.compute_dtype, *(["--remat"] if args.remat else [])]


if __name__ == "__main__":
    main()

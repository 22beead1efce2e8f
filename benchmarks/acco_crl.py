"""ACCO vs DDP vs ZeRO-1 in CRL's training path (`crl.Config(overlap=true)`, the chunks `train.run` runs):
MEASURED wall time to a held-out InfoNCE loss, homogeneous workers and one slowed worker, side by side.

    python benchmarks/acco_crl.py [--budget 20] [--comm-ms 15] [--slow 2] [--micro 2] [--seed 0]
                                  [--out benchmarks/results/acco_crl.txt]

Every method is the same CRL agent (point_maze/open, 8 envs, encoders width 64 depth 4, batch 64, σ = 1/4)
on a mesh of 2 forced CPU devices, built with `overlap=true`, so its chunks run from the host on
`acco.OverlappedAcco` (per-device `accumulate` programs, one `communicate` program per round):
- DDP (`zero_optimizer=false`): `--micro` micro-batches per device, psum + replicated Adam;
- ZeRO-1 (`zero_optimizer=true`): the same with reduce-scatter, sharded Adam, all-gather;
- ACCO (`acco=acco`): two rounds per update, every device accumulating micro-batches until the round's
  communication has finished (at least `--micro`/2 per round), the slowed one contributing fewer.
Each communication is dispatched `--comm-ms` late (a latency-bound link, the same for every method);
`--slow s` makes device 1 sleep (s - 1) x each micro-batch's compute time (a straggler).

Each method trains chunk by chunk (128 env steps, 32 updates) for `--budget` seconds after one untimed
warm-up chunk (compiles). After every chunk, untimed: the InfoNCE critic loss on a held-out batch of 256
(s, a, g) drawn from another seed's random-policy episodes. Reported: updates, wall time per update,
micro-batches per update and device, the held-out loss at the end, and the wall time to first reach
ZeRO-1's final held-out loss, with its ratio to DDP's and ZeRO-1's. One seed on a shared 2-core machine.
"""
from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

METHODS = {"ddp": "DDP", "zero1": "ZeRO-1", "acco": "ACCO"}
BASE = dict(env="point_maze/open", num_envs=8, env_steps=10**7, learning_starts=256, chunk_env_steps=128, utd=0.25,
            batch_size=64, width=64, depth=4, actor_width=32, actor_depth=4, repr_dim=16, buffer_size=4096,
            eval_episodes=1, episode_length=64, data_parallel=True, overlap=True)


def config(method: str, args, slow: float):
    from scaling_rl.agents import crl
    mode = {"ddp": {"zero_optimizer": False}, "zero1": {"zero_optimizer": True},
            "acco": {"zero_optimizer": True, "acco": "acco"}}[method]
    return crl.Config(**BASE, **mode, overlap_micro=args.micro, overlap_slowdown=slow,
                      overlap_latency_ms=args.comm_ms)


def held_out_loss_fn(cfg):
    """InfoNCE critic loss of a state's encoders on a fixed batch from another seed's warm-up episodes."""
    import jax
    import jax.numpy as jnp

    from scaling_rl import goal_replay
    from scaling_rl.agents import crl

    other = crl.make(dataclasses.replace(cfg, overlap=False, zero_optimizer=False, acco="off", data_parallel=False))
    buf = jax.jit(other.init)(jax.random.PRNGKey(10_000)).buffer
    now, fut, _ = goal_replay.sample(buf, jax.random.PRNGKey(1), 256, cfg.gamma)
    sa_net = crl.Encoder(crl.encoder_backbone(cfg), cfg.repr_dim)

    @jax.jit
    def loss(params):
        phi = sa_net.apply({"params": params["sa"]}, jnp.concatenate([now["state"], now["action"]], -1))
        psi = sa_net.apply({"params": params["g"]}, fut["achieved"])
        return crl.contrastive_loss(phi, psi, cfg)[0]
    return loss


def run_method(method: str, slow: float, args, held_out) -> dict:
    import jax

    from scaling_rl.agents import crl
    cfg = config(method, args, slow)
    agent = crl.make(cfg)
    state = jax.jit(jax.vmap(agent.init))(jax.random.PRNGKey(args.seed)[None])
    state, _ = agent.host_chunk(state)                      # warm-up chunk: compiles, untimed
    times, losses, mb, updates, t = [0.0], [float(held_out(jax.tree.map(lambda x: x[0], state.learner.params)))], [], 0, 0.0
    while t < args.budget:
        t0 = time.perf_counter()
        state, m = agent.host_chunk(state)
        jax.block_until_ready(state)
        t += time.perf_counter() - t0
        updates += int(cfg.chunk_env_steps * cfg.utd)
        times.append(t)
        losses.append(float(held_out(jax.tree.map(lambda x: x[0], state.learner.params))))
        mb.append([float(m[f"micro_batches/d{d}"][0]) for d in range(2)])
    return {"times": times, "losses": losses, "updates": updates, "per_update": t / updates,
            "mb_per_update": np.mean(mb, axis=0).tolist()}


def time_to(r: dict, target: float) -> float:
    return next((t for t, v in zip(r["times"], r["losses"]) if v <= target), float("inf"))


def table(res: dict) -> list[str]:
    target = res["zero1"]["losses"][-1]
    rows = [f"{'method':<8} {'updates':>7} {'t/update':>9} {'mb/upd d0':>9} {'mb/upd d1':>9} {'loss @ end':>10} "
            f"| {'t to ' + format(target, '.3f') + ' (ZeRO-1 final)':>26} {'vs DDP':>7} {'vs ZeRO-1':>9}"]
    t = {m: time_to(res[m], target) for m in METHODS}
    ratio = lambda a, b: f"{a / b:.2f}" if np.isfinite(a) and np.isfinite(b) and b > 0 else "n/a"  # noqa: E731
    for m, name in METHODS.items():
        r = res[m]
        cell = f"{t[m]:.1f} s" if np.isfinite(t[m]) else "not reached"
        rows.append(f"{name:<8} {r['updates']:>7d} {r['per_update'] * 1e3:>7.0f}ms {r['mb_per_update'][0]:>9.1f} "
                    f"{r['mb_per_update'][1]:>9.1f} {r['losses'][-1]:>10.3f} | {cell:>26} "
                    f"{ratio(t[m], t['ddp']):>7} {ratio(t[m], t['zero1']):>9}")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=20.0, help="training seconds per method and setting")
    ap.add_argument("--comm-ms", type=float, default=15.0, help="simulated link latency per communication (ms)")
    ap.add_argument("--slow", type=float, default=2.0, help="slow-down of device 1 in the heterogeneous setting")
    ap.add_argument("--micro", type=int, default=2, help="micro-batches per device and update")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="also write the tables here")
    args = ap.parse_args(argv)
    if args.budget <= 0 or args.comm_ms < 0 or args.slow < 1 or args.micro < 1:
        print("acco_crl: error: --budget > 0, --comm-ms >= 0, --slow >= 1 and --micro >= 1 are required",
              file=sys.stderr)
        return 2
    held_out = held_out_loss_fn(config("zero1", args, 1.0))
    lines = [f"# benchmarks/acco_crl.py --budget {args.budget:g} --comm-ms {args.comm_ms:g} --slow {args.slow:g} "
             f"--micro {args.micro} --seed {args.seed}"]
    for label, slow in (("homogeneous", 1.0), (f"device 1 slowed {args.slow:g}x", args.slow)):
        res = {m: run_method(m, slow, args, held_out) for m in METHODS}
        lines += ["", f"## {label}", *table(res)]
        print("\n".join(lines[-5:]), flush=True)
    if args.out:
        from scaling_rl import io
        io.atomic_write_text(args.out, "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

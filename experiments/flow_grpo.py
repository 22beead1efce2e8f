"""Flow-GRPO vs denoising reduction vs Flow-GRPO-Fast (official) vs shared-prefix, at equal training
FLOPs: evaluation reward and fidelity against training FLOPs.

    python experiments/flow_grpo.py                    # CPU default: 2-D toy, 3 seeds, ~10 min
    python experiments/flow_grpo.py --out runs/flow_grpo_shapes --dataset shapes \\
        --reward shapes_red --width 512 --depth 4 --pretrain-steps 20000 --pretrain-batch 256 \\
        --pretrain-lr 1e-3 --lr 3e-4 --groups 16 --group-size 16 --updates 400 --chunk-updates 10 --seeds 3  # GPU

Four variants from the same pretrained reference (`pretrain_seed` 0) and seeds, each given the same
training-FLOP budget (that of `--updates` updates of `reduction`; each variant runs as many whole
chunks of updates as fit, so its final FLOPs are within one chunk of the budget):
  flow_grpo      T_train = T_eval (no reduction), loss on every denoising step;
  reduction      T_train < T_eval (denoising reduction), every step;
  fast           T_train < T_eval, official Flow-GRPO-Fast: own noise and ODE prefix per sample,
                 SDE and loss on a window of `fast_window` steps in the first half;
  shared_prefix  T_train < T_eval, one noise and ODE prefix per group, SDE branching on a window
                 anywhere (our earlier "Fast").
Fidelity beside reward (`scaling_rl.flow.fidelity`, held-out data): MMD² to the data, and the
toy's radius W1 (or the shapes' fraction of data-like images); a reward gain that costs fidelity
shows in the table's fidelity columns and the figure's fidelity panel.
Evaluation is always the ODE at T_eval (noise from the seed and chunk key: fresh each chunk, shared
by policy and reference) (`eval_return`, the reward), with the
per-step KL to the reference (train-time; also × T_train, since steps on a finer grid are
closer: the per-trajectory figure compares variants), and diversity = mean pairwise distance of same-condition
samples (a collapse to one mode — reward hacking — drives it to 0). FLOPs are the velocity-network
FLOPs of sampling + reference + training, analytic (`grpo.update_flops`).

The reference is pretrained once, on the host, and written to --out/reference-<hash>.msgpack (the hash
of `grpo.PRETRAIN_FIELDS`: a rerun with the same pretraining reuses it); every variant starts from it
(`reference_params`) instead of re-pretraining. Each variant is one resumable `train.run` under
--out/<variant>/ (rerun to resume / reuse).
Writes curves.csv (variant, seed, chunk, flops, eval_return, kl, eval_diversity, ...),
flow_grpo.png, table.md, summary.json into --out.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pandas as pd  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scaling_rl import io as sio  # noqa: E402

METRICS = ("eval_return", "kl", "kl_path", "eval_diversity", "reward", "flops", "env_steps",
           "eval_fid_mmd")
FIDELITY = {"toy2d": "eval_fid_radius_w1", "shapes": "eval_fid_valid_frac"}


def variants(base, t_train: int, window: int) -> dict:
    """The four variants at the base's number of updates (before equalising FLOPs)."""
    return {"flow_grpo": dataclasses.replace(base, t_train=base.t_eval, sampler="full"),
            "reduction": dataclasses.replace(base, t_train=t_train, sampler="full"),
            "fast": dataclasses.replace(base, t_train=t_train, sampler="fast", fast_window=window),
            "shared_prefix": dataclasses.replace(base, t_train=t_train, sampler="shared_prefix",
                                                 fast_window=window)}


def equal_flops(cfgs: dict, budget: float, dim: int, classes: int) -> dict:
    """Each config with as many whole chunks of updates as fit in `budget` analytic FLOPs (>= 1)."""
    from scaling_rl.flow import grpo
    out = {}
    for name, cfg in cfgs.items():
        per_chunk = grpo.update_flops(cfg, dim, classes)["total"] * cfg.chunk_updates
        chunks = max(int(budget // per_chunk), 1)
        out[name] = dataclasses.replace(cfg, updates=chunks * cfg.chunk_updates)
    return out


def reference_file(base, out: Path) -> str:
    """The pretrained reference of `base` as a params file under `out`, named by a hash of the fields
    that determine it (`grpo.PRETRAIN_FIELDS`); pretrained (jitted, on the host) and written
    atomically only when absent. Returns its path."""
    import hashlib
    import json
    import time

    import flax.serialization
    import jax

    from scaling_rl.flow import grpo

    fields = {k: getattr(base, k) for k in grpo.PRETRAIN_FIELDS}
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
    path = out / f"reference-{digest}.msgpack"
    if not path.exists():
        start = time.perf_counter()
        params = jax.block_until_ready(jax.jit(grpo.make(base).pretrain)())
        sio.atomic_write_bytes(path, flax.serialization.to_bytes(params))
        sio.atomic_write_json(path.with_suffix(".json"), fields)
        print(f"pretrained the reference in {time.perf_counter() - start:.0f} s -> {path}", flush=True)
    return str(path)


def flops_to(curve: pd.DataFrame, target: float):
    """FLOPs (seed mean) at the first chunk where the seed-mean eval reward reaches `target`."""
    hit = curve[curve["eval_return"] >= target]
    return float(hit["flops"].iloc[0]) if len(hit) else None


def plot(mean: pd.DataFrame, sd: pd.DataFrame, ref: dict, fid: str, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = ("eval_return", fid, "eval_fid_mmd", "kl_path", "eval_diversity")
    fig, axes = plt.subplots(1, len(keys), figsize=(21, 3.6))
    for (name, m), (_, s) in zip(mean.groupby("variant", sort=False), sd.groupby("variant", sort=False)):
        for ax, key in zip(axes, keys):
            ax.plot(m["flops"], m[key], "o-", ms=3, label=name)
            ax.fill_between(m["flops"], m[key] - s[key], m[key] + s[key], alpha=0.2)
    for ax, key in zip(axes, keys[:3]):
        ax.axhline(ref[key], color="grey", ls="--", lw=1, label="pretrained")
    for ax, label in zip(axes, ("eval reward (ODE at T_eval)", f"fidelity: {fid[9:]} (held-out data)",
                                "fidelity: MMD² to held-out data", "KL to reference (per step × T_train)",
                                "diversity (pairwise distance)")):
        ax.set_xscale("log")
        ax.set_xlabel("training FLOPs (velocity net)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    sio.atomic_savefig(fig, path, fmt="png", dpi=120)
    plt.close(fig)


def table(rows: list[dict], fid: str) -> str:
    head = ("| variant | T_train | loss steps | updates | FLOPs / update | final FLOPs | final eval reward | "
            f"{fid[9:]} | MMD² | KL / step | KL × T_train | diversity | FLOPs to target | train s |")
    lines = [head, "|" + "---|" * 14]
    for r in rows:
        to = "not reached" if r["flops_to_target"] is None else f"{r['flops_to_target']:.2e}"
        lines.append(f"| {r['variant']} | {r['t_train']} | {r['loss_steps']} | {r['updates']} | "
                     f"{r['flops_per_update']:.2e} | {r['flops']:.2e} | "
                     f"{r['eval_return']:.3f} ± {r['eval_return_sd']:.3f} | {r['fidelity']:.3f} ± "
                     f"{r['fidelity_sd']:.3f} | {r['mmd']:.4f} | {r['kl']:.3f} | {r['kl_path']:.2f} | "
                     f"{r['eval_diversity']:.3f} | {to} | {r['wall_s']:.0f} |")
    return "\n".join(lines) + "\n"


def probe_pretrained(base, t_evals: list[int]) -> str:
    """How data-like the pretrained reference's ODE samples are at each T_eval (shapes: lit-pixel
    fraction, detected squares per image, data-like fraction, shapes_red; toy: radius W1), beside
    the same numbers on held-out data. A markdown table."""
    import time

    import jax
    import jax.numpy as jnp

    from scaling_rl.flow import data, fidelity, grpo

    agent = grpo.make(base)
    start = time.perf_counter()
    state = jax.block_until_ready(agent.init(jax.random.PRNGKey(0)))
    wall = time.perf_counter() - start
    n = base.eval_samples
    reward = grpo.rewards_lib.get(base.reward)
    held_out, _ = agent.dataset.sample(jax.random.PRNGKey(1), n)

    def row(name, x, cond):
        out = {k: float(v) for k, v in fidelity.measures(base.dataset, x, held_out).items()}
        cells = [name, f"{float(jnp.mean(reward(x, cond))):.3f}", f"{out['mmd']:.4f}"]
        if base.dataset == "shapes":
            lit = float(jnp.mean(jnp.max(x.reshape(n, -1, data.COLOURS), -1) > 0))
            cells += [f"{lit:.3f}", f"{float(jnp.mean(data.detect_shapes(x)[2])):.2f}",
                      f"{out['valid_frac']:.3f}"]
        else:
            cells += [f"{out['radius_w1']:.3f}"]
        return "| " + " | ".join(cells) + " |"

    extra = "lit-pixel fraction | squares / image | data-like fraction" if base.dataset == "shapes" \
        else "radius W1"
    lines = [f"Pretrained reference: width {base.width}, depth {base.depth}, {base.pretrain_steps} steps × "
             f"{base.pretrain_batch}, lr {base.pretrain_lr} ({base.pretrain_warmup} warm-up steps, cosine), "
             f"pretraining seed {base.pretrain_seed}; {n} samples; init {wall:.0f} s "
             f"(compile + pretraining).\n", f"| samples | {base.reward} | MMD² | {extra} |",
             "|" + "---|" * (4 if base.dataset != "shapes" else 6)]
    x_data, label = agent.dataset.sample(jax.random.PRNGKey(2), n)
    lines.append(row("held-out data", x_data, label))
    for t in t_evals:
        x, cond = agent.sample_ode(state.params, jax.random.PRNGKey(3), n, t)
        lines.append(row(f"ODE, T_eval = {t}", x, cond))
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    import jax

    from scaling_rl import train
    from scaling_rl.flow import grpo

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/flow_grpo")
    p.add_argument("--dataset", default="toy2d")
    p.add_argument("--reward", default="toy_angle")
    p.add_argument("--conditional", action="store_true")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--pretrain-steps", type=int, default=1500)
    p.add_argument("--pretrain-batch", type=int, default=256)
    p.add_argument("--pretrain-lr", type=float, default=3e-3)
    p.add_argument("--pretrain-warmup", type=int, default=0, help="linear lr warm-up steps of pretraining")
    p.add_argument("--pretrain-seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--beta", type=float, default=0.01)
    p.add_argument("--noise-schedule", default="flow_grpo", help="sqrt | flow_grpo (the paper's)")
    p.add_argument("--noise-level", type=float, default=0.7)
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--t-eval", type=int, default=40)
    p.add_argument("--t-train", type=int, default=10)
    p.add_argument("--fast-window", type=int, default=2)
    p.add_argument("--updates", type=int, default=80, help="of `reduction`: sets the FLOP budget")
    p.add_argument("--chunk-updates", type=int, default=4)
    p.add_argument("--eval-samples", type=int, default=256)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--seed", type=int, default=0, help="root seed of the runs (seed i: fold_in(PRNGKey(seed), i))")
    p.add_argument("--target", type=float, default=0.9, help="eval reward for 'FLOPs to target'")
    p.add_argument("--probe-pretrained", default="", metavar="T1,T2,...",
                   help="only pretrain and print how data-like the reference's samples are at these T_eval")
    args = p.parse_args(argv)

    base = grpo.Config(dataset=args.dataset, reward=args.reward, conditional=args.conditional,
                       width=args.width, depth=args.depth, pretrain_steps=args.pretrain_steps,
                       pretrain_batch=args.pretrain_batch, pretrain_lr=args.pretrain_lr,
                       pretrain_warmup=args.pretrain_warmup, pretrain_seed=args.pretrain_seed,
                       lr=args.lr, beta=args.beta,
                       groups=args.groups, group_size=args.group_size, t_eval=args.t_eval,
                       updates=args.updates, chunk_updates=args.chunk_updates,
                       eval_samples=args.eval_samples, noise_schedule=args.noise_schedule,
                       noise_level=args.noise_level)
    if args.probe_pretrained:
        try:
            t_evals = [int(t) for t in args.probe_pretrained.split(",")]
        except ValueError:
            print(f"flow_grpo.py: --probe-pretrained: {args.probe_pretrained!r} is not a comma-separated "
                  "list of integers", file=sys.stderr)
            return 2
        print(probe_pretrained(base, t_evals))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    frames, rows = [], []
    base = dataclasses.replace(base, reference_params=reference_file(base, out))
    cfgs = variants(base, args.t_train, args.fast_window)
    probe = grpo.make(cfgs["reduction"])
    dim, classes = probe.dataset.dim, probe.num_classes
    budget = grpo.update_flops(cfgs["reduction"], dim, classes)["total"] * args.updates
    fid = FIDELITY[args.dataset]
    for name, cfg in equal_flops(cfgs, budget, dim, classes).items():
        df = train.run("scaling_rl.flow.grpo", cfg, out / name, seeds=args.seeds, seed=args.seed,
                       progress=False)
        wall = float(df["wall_time"].max())    # the run's own clock (compile + pretraining included)
        # per-step KLs are smaller on finer grids: per step × T_train compares whole trajectories
        df = df.assign(variant=name, kl_path=df["kl"] * cfg.t_train)
        frames.append(df)
        ref = {"eval_return": float(df["eval_ref_return"].mean()), fid: float(df["eval_ref_" + fid[5:]].mean()),
               "eval_fid_mmd": float(df["eval_ref_fid_mmd"].mean())}
        last = df[df["chunk"] == df["chunk"].max()]
        agent = grpo.make(cfg)
        curve = df.groupby("chunk")[list(METRICS)].mean()
        rows.append({"variant": name, "t_train": cfg.t_train, "loss_steps": cfg.window,
                     "updates": cfg.updates, "flops": float(last["flops"].mean()),
                     "fidelity": float(last[fid].mean()),
                     "fidelity_sd": float(last[fid].std(ddof=1)) if len(last) > 1 else 0.0,
                     "mmd": float(last["eval_fid_mmd"].mean()),
                     "flops_per_update": grpo.update_flops(cfg, agent.dataset.dim, agent.num_classes)["total"],
                     "eval_return": float(last["eval_return"].mean()),
                     "eval_return_sd": float(last["eval_return"].std(ddof=1)) if len(last) > 1 else 0.0,
                     "kl": float(last["kl"].mean()), "kl_path": float(last["kl_path"].mean()),
                     "eval_diversity": float(last["eval_diversity"].mean()),
                     "flops_to_target": flops_to(curve, args.target), "wall_s": wall,
                     "param_count": agent.param_count})
        print(f"{name}: final eval reward {rows[-1]['eval_return']:.3f}, {fid} {rows[-1]['fidelity']:.3f}, "
              f"KL {rows[-1]['kl']:.3f}, "
              f"diversity {rows[-1]['eval_diversity']:.3f}, FLOPs to {args.target}: "
              f"{rows[-1]['flops_to_target']}", flush=True)
    curves = pd.concat(frames, ignore_index=True)
    cols = ["variant", "seed", "chunk"] + [c for c in METRICS if c in curves] + [fid, "eval_ref_return"]
    sio.atomic_write_text(out / "curves.csv", curves[cols].to_csv(index=False))
    keys = list(METRICS) + [fid]
    mean = curves.groupby(["variant", "chunk"], sort=False)[keys].mean().reset_index()
    sd = curves.groupby(["variant", "chunk"], sort=False)[keys].std(ddof=1).fillna(0.0).reset_index()
    plot(mean, sd, ref, fid, out / "flow_grpo.png")
    text = (f"Pretrained reference: eval reward {ref['eval_return']:.3f}, {fid[9:]} {ref[fid]:.3f}, MMD² "
            f"{ref['eval_fid_mmd']:.4f} (ODE, T_eval={args.t_eval}); {args.seeds} seeds; equal FLOP budget "
            f"{budget:.2e} (= {args.updates} updates of reduction) of B={base.batch_size} (G={base.group_size}); "
            f"noise {args.noise_schedule} a={args.noise_level}; ± = seed std; "
            f"target {args.target}; N={rows[0]['param_count']:,}; {jax.devices()[0].platform}.\n\n"
            + table(rows, fid))
    sio.atomic_write_text(out / "table.md", text)
    sio.atomic_write_json(out / "summary.json", {"args": vars(args), "reference": ref, "budget_flops": budget,
                                                 "variants": rows})
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

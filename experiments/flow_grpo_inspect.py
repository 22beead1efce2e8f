"""What the final policies of a shapes `experiments/flow_grpo.py` run draw: per policy (the reference,
each variant) and held-out data, 256 ODE samples at the run's T_eval (one noise key): data-like
fraction, detected squares and red squares per image, images with a red square, and the number of
distinct layouts (cell × colour patterns) among the data-like images — one layout is a collapse the
per-image data-like fraction cannot see. Prints a markdown table; saves 8 samples per row as a png.

    python experiments/flow_grpo_inspect.py runs/flow_grpo_shapes_cpu_lr3e-5 samples.png
"""
from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scaling_rl import io as sio  # noqa: E402

VARIANTS = ("flow_grpo", "reduction", "fast", "shared_prefix")
SAMPLES, SHOWN, KEY = 256, 8, 7


@functools.cache
def _detect():
    """Jitted (occupied, colour, count, valid) of a batch of shapes images."""
    import jax

    from scaling_rl.flow import data

    return jax.jit(lambda x: data.detect_shapes(x) + (data.shapes_valid(x),))


def describe(x) -> tuple:
    """(data-like fraction, squares / image, red squares / image, images with a red square, layouts)."""
    occupied, colour, count, valid = (np.asarray(a) for a in _detect()(x))
    red = np.sum(occupied & (colour == 0), -1)
    layouts = {tuple(np.where(o, c, -1)) for o, c in zip(occupied[valid], colour[valid])}
    return float(valid.mean()), float(count.mean()), float(red.mean()), float((red >= 1).mean()), len(layouts)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or not all((Path(argv[0]) / v / "config.json").exists() for v in VARIANTS):
        print("flow_grpo_inspect.py: usage: flow_grpo_inspect.py RUN_DIR OUT.png (RUN_DIR holds the 4 variants' "
              "finished runs of experiments/flow_grpo.py)", file=sys.stderr)
        return 2
    import jax

    from scaling_rl import train
    from scaling_rl.flow import data, grpo

    run, rows, shown = Path(argv[0]), [], {}
    for i, variant in enumerate(VARIANTS):
        cfg = grpo.Config.from_dict(json.loads((run / variant / "config.json").read_text())["config"])
        if cfg.dataset != "shapes":
            print(f"flow_grpo_inspect.py: {run} is a {cfg.dataset!r} run; shapes only", file=sys.stderr)
            return 2
        agent = grpo.make(cfg)
        state, _ = train.load_state(run / variant)
        first = lambda tree: jax.tree.map(lambda a: a[0], tree)          # seed 0
        policies = ([("reference", first(state.ref_params))] if i == 0 else []) + [(variant, first(state.params))]
        for name, params in policies:
            x, _ = agent.sample_ode(params, jax.random.PRNGKey(KEY), SAMPLES, cfg.t_eval)
            rows.append((name,) + describe(x))
            shown[name] = np.asarray(x[:SHOWN])
    x, _ = data.shapes_sample(jax.random.PRNGKey(KEY), SAMPLES)
    rows.append(("held-out data",) + describe(x))
    shown["held-out data"] = np.asarray(x[:SHOWN])
    print(f"| samples ({SAMPLES}, ODE at T_eval) | data-like fraction | squares / image | red squares / image | "
          "images with a red square | distinct layouts |")
    print("|---|---|---|---|---|---|")
    for name, valid, squares, red, any_red, layouts in rows:
        print(f"| {name} | {valid:.3f} | {squares:.2f} | {red:.2f} | {any_red:.3f} | {layouts} |")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(shown), SHOWN, figsize=(SHOWN, 1.05 * len(shown)))
    for r, (name, imgs) in enumerate(shown.items()):
        for c in range(SHOWN):
            img = imgs[c].reshape(data.SIDE, data.SIDE, data.COLOURS)
            axes[r, c].imshow(np.clip((img + 1.0) / 2.0, 0.0, 1.0), interpolation="nearest")
            axes[r, c].set_xticks([])
            axes[r, c].set_yticks([])
        axes[r, 0].set_ylabel(name, fontsize=7, rotation=0, ha="right")
    fig.tight_layout()
    sio.atomic_savefig(fig, argv[1], fmt="png", dpi=100)
    plt.close(fig)
    return 0


if __name__ == "__main__":
    sys.exit(main())

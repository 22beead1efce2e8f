"""Compile time of one backbone update vs depth: the scanned stack against the unrolled reference.

One update = value_and_grad of an MSE loss through `Backbone` + an optax adam step, jitted; we time
`.lower()` (trace) and `.compile()` (XLA) on abstract shapes, so nothing is initialised or run.
The scanned stack's program does not grow with depth; the unrolled one grows linearly. Both sides
are the best of --repeats cold compiles.

    .venv/bin/python benchmarks/depth_compile.py --kind crl --width 64
Last line: compile_ratio_depth<max>_over_depth<min>=<x> for the scanned stack (target <= 2).
"""
from __future__ import annotations

import argparse
import dataclasses
import time

import jax
import jax.numpy as jnp
import optax

from scaling_rl.nets import Backbone, BackboneConfig, backbone_param_count

IN_DIM = 17


def compile_update(cfg: BackboneConfig, batch: int) -> dict:
    """Lower and compile one adam update of `Backbone(cfg)`; returns seconds and program size."""
    model = Backbone(cfg)
    opt = optax.adam(1e-3)
    x = jax.ShapeDtypeStruct((batch, IN_DIM), jnp.float32)
    y = jax.ShapeDtypeStruct((batch, cfg.width), jnp.float32)
    params = jax.eval_shape(model.init, jax.random.key(0), x)
    opt_state = jax.eval_shape(opt.init, params)

    def update(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(lambda p: jnp.mean((model.apply(p, x) - y) ** 2))(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    c0, t0 = time.process_time(), time.perf_counter()
    lowered = jax.jit(update).lower(params, opt_state, x, y)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2, c2 = time.perf_counter(), time.process_time()
    return {"lower_s": t1 - t0, "compile_s": t2 - t1, "total_s": t2 - t0, "cpu_s": c2 - c0,
            "hlo_kchars": len(compiled.as_text()) / 1e3}


def best_of(cfg: BackboneConfig, batch: int, repeats: int) -> dict:
    """Fastest of `repeats` cold compiles (each builds a new jitted function): robust to a busy box."""
    return min((compile_update(cfg, batch) for _ in range(repeats)), key=lambda r: r["total_s"])


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", default="crl", choices=["crl", "bro", "simba", "mlp"])
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--depths", default="4,64,256,1024", help="comma-separated depths (crl: Dense layers)")
    ap.add_argument("--max-unrolled-depth", type=int, default=256,
                    help="skip the unrolled reference above this depth (it takes minutes at 1024)")
    ap.add_argument("--remat", action="store_true", help="rematerialise each block")
    ap.add_argument("--repeats", type=int, default=3,
                    help="best of this many cold compiles, for the scanned and the unrolled stack alike")
    args = ap.parse_args(argv)
    depths = [int(d) for d in args.depths.split(",")]

    # Cold compiles only: no persistent cache; warm the backend and optax with a throwaway compile.
    jax.config.update("jax_enable_compilation_cache", False)
    base = BackboneConfig(kind=args.kind, width=args.width, depth=depths[0], remat=args.remat)
    compile_update(dataclasses.replace(base, width=max(2, args.width // 2)), args.batch)

    rows = []
    for depth in depths:
        cfg = dataclasses.replace(base, depth=depth)
        row = {"depth": depth, "params": backbone_param_count(cfg, IN_DIM),
               "scanned": best_of(dataclasses.replace(cfg, scan=True), args.batch, args.repeats),
               "unrolled": (best_of(dataclasses.replace(cfg, scan=False), args.batch, args.repeats)
                            if depth <= args.max_unrolled_depth else None)}
        rows.append(row)
        _print_row(row)  # progress: the unrolled compiles can be slow

    _print_table(rows, args)
    lo, hi = rows[0], rows[-1]
    cpu_ratio = hi["scanned"]["cpu_s"] / lo["scanned"]["cpu_s"]
    print(f"compile_cpu_ratio_depth{hi['depth']}_over_depth{lo['depth']}={cpu_ratio:.3f}")
    ratio = hi["scanned"]["total_s"] / lo["scanned"]["total_s"]
    print(f"compile_ratio_depth{hi['depth']}_over_depth{lo['depth']}={ratio:.3f}")
    return {"rows": rows, "ratio": ratio, "cpu_ratio": cpu_ratio}


def _fmt(r: dict | None, key: str, unit: str = "") -> str:
    return "skipped" if r is None else f"{r[key]:.2f}{unit}"


def _print_row(row: dict) -> None:
    print(f"  depth {row['depth']}: scanned {_fmt(row['scanned'], 'total_s', 's')}, "
          f"unrolled {_fmt(row['unrolled'], 'total_s', 's')}", flush=True)


def _print_table(rows: list[dict], args) -> None:
    header = ["depth", "params", "scan lower s", "scan compile s", "scan total s", "scan cpu s",
              "scan HLO kchar", "unroll lower s", "unroll compile s", "unroll total s", "unroll cpu s",
              "unroll HLO kchar", "unroll/scan"]
    body = []
    for row in rows:
        s, u = row["scanned"], row["unrolled"]
        body.append([str(row["depth"]), f"{row['params']:,}", _fmt(s, "lower_s"), _fmt(s, "compile_s"),
                     _fmt(s, "total_s"), _fmt(s, "cpu_s"), f"{s['hlo_kchars']:.0f}", _fmt(u, "lower_s"),
                     _fmt(u, "compile_s"), _fmt(u, "total_s"), _fmt(u, "cpu_s"),
                     "skipped" if u is None else f"{u['hlo_kchars']:.0f}",
                     "skipped" if u is None else f"{u['total_s'] / s['total_s']:.1f}x"])
    title = (f"compile time of one adam update: kind={args.kind} width={args.width} batch={args.batch} "
             f"remat={args.remat} backend={jax.default_backend()}")
    try:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title)
        for h in header:
            table.add_column(h, justify="right")
        for b in body:
            table.add_row(*b)
        Console(width=200).print(table)
    except ImportError:
        print(title)
        widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(header)]
        print("  ".join(h.rjust(w) for h, w in zip(header, widths)))
        for b in body:
            print("  ".join(c.rjust(w) for c, w in zip(b, widths)))


if __name__ == "__main__":
    main()

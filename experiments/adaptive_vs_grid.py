"""The same study run as a full grid and adaptively: same law within intervals? compute, env steps, wall?

    scaling-rl sweep run sweeps/quickstart.yaml --out runs/qs_grid
    scaling-rl sweep run sweeps/quickstart_adaptive.yaml --out runs/qs_adaptive
    .venv/bin/python experiments/adaptive_vs_grid.py --grid runs/qs_grid --adaptive runs/qs_adaptive \
        --out runs/qs_compare

The grid is fitted exactly as the adaptive study's rounds are (the adaptive design's thresholds, δ,
bootstrap size and level; `sweep.adaptive.fit_round`), so the two fits differ only in their data.
Prints (and writes `<out>/comparison.md`, `<out>/comparison.png`): trials, env steps, FLOPs
(F = C + δ·D over every trial run) and summed trial wall time for each design; per threshold, the
compute-optimal σ*, N* and their 90% intervals; the budget laws' exponents and their values at the
grid's reference budget; and for every quantity whether each estimate lies inside the other design's
interval ("agree"). The two stores must share no seed run (same config and seed): refused otherwise.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path


def _fmt(v, digits=3) -> str:
    return "—" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.{digits}g}"


def _iv(d: dict) -> str:
    if d.get("lo") is None:
        return f"{_fmt(d.get('estimate'))} (no interval: {d.get('reason') or 'n/a'})"
    return f"{_fmt(d['estimate'])} [{_fmt(d['lo'])}, {_fmt(d['hi'])}]"


def _agree(a: dict, b: dict) -> str:
    """Each estimate inside the other's interval (where both have one)."""
    if a.get("lo") is None or b.get("lo") is None or a.get("estimate") is None or b.get("estimate") is None:
        return "n/a"
    ok = a["lo"] <= b["estimate"] <= a["hi"] and b["lo"] <= a["estimate"] <= b["hi"]
    overlap = max(a["lo"], b["lo"]) <= min(a["hi"], b["hi"])
    return "yes" if ok else ("intervals overlap" if overlap else "NO")


def _usage(store: Path, delta: float) -> dict:
    from scaling_rl.sweep.adaptive import spent
    from scaling_rl.sweep.collect import collect
    from scaling_rl.sweep.store import Store

    st = Store(store)
    use = spent(collect(store), delta)
    statuses = [st.status(t) for t in st.trial_ids()]
    use["trials"] = len(statuses)
    use["wall_s"] = sum(float(s.get("wall_s") or 0) for s in statuses)
    use["stopped_early"] = sum(1 for s in statuses if s.get("stopped_early"))
    return use


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", required=True, help="store of the full-grid run")
    ap.add_argument("--adaptive", required=True, help="store of the adaptive run")
    ap.add_argument("--out", default="runs/adaptive_vs_grid")
    ap.add_argument("--grid-wall", type=float, default=None, help="measured wall seconds of the grid sweep")
    ap.add_argument("--adaptive-wall", type=float, default=None, help="measured wall seconds of the adaptive sweep")
    args = ap.parse_args()
    from types import SimpleNamespace

    from scaling_rl.io import atomic_write_text
    from scaling_rl.scaling import report
    from scaling_rl.sweep import adaptive as ad
    from scaling_rl.sweep import adaptive_plots
    from scaling_rl.sweep.store import Store

    state = ad.load_state(args.adaptive)
    if not state["rounds"] or "fit" not in state["rounds"][-1]:
        raise SystemExit(f"{args.adaptive}: no fitted adaptive round")
    d = dict(state["design"])
    d["points"] = tuple(tuple(p) for p in d.get("points") or ())
    d["thresholds"] = tuple(d["thresholds"])
    if isinstance(d.get("initial"), list):
        d["initial"] = tuple(tuple(p) for p in d["initial"])
    design = ad.Design(**d)
    delta = float(state["delta"])
    last = state["rounds"][-1]
    fit_a = json.loads((Path(args.adaptive) / "adaptive" / f"round_{last['round']}" / "fit.json").read_text())
    g = Store(args.grid)
    grid_trials = [g.trial(t) for t in g.trial_ids()]
    a = Store(args.adaptive)
    from scaling_rl.sweep.trial import seed_runs
    shared = seed_runs(grid_trials) & seed_runs(a.trial(t) for t in a.trial_ids())
    if shared:
        raise SystemExit(f"{args.adaptive}: {len(shared)} seed run(s) are also in {args.grid} (same config and seed): "
                         "the comparison would measure their shared noise; give the adaptive spec its own `seed:`")
    n_boot = int(last["fit"].get("n_bootstrap", design.n_bootstrap))   # as many replicates as the final round
    fit_g, cap, _ = ad.fit_round(SimpleNamespace(out_dir=Path(args.grid)), design, grid_trials, delta,
                                 n_bootstrap=n_boot)
    fit_g = report.jsonable(fit_g)
    use = {"full grid": _usage(Path(args.grid), delta), "adaptive + early stopping": _usage(Path(args.adaptive), delta)}
    if args.grid_wall:
        use["full grid"]["sweep_wall_s"] = args.grid_wall
    if args.adaptive_wall:
        use["adaptive + early stopping"]["sweep_wall_s"] = args.adaptive_wall

    lines = [f"# Full grid vs adaptive: `{args.grid}` vs `{args.adaptive}`", "",
             f"Both fitted at J = {list(design.thresholds)} ({design.metric}), δ = {delta:.4g} FLOPs/env step, "
             f"{n_boot} seed-bootstrap replicates, {int(design.level * 100)}% intervals. "
             f"Adaptive: {len(state['rounds'])} rounds, last decision `{last['decision']}`.", "",
             "| design | trials | stopped early | env steps | FLOPs | summed trial wall s | sweep wall s |",
             "|---|---|---|---|---|---|---|"]
    for name, u in use.items():
        lines.append(f"| {name} | {u['trials']} | {u['stopped_early']} | {u['env_steps']:.4g} | {u['flops']:.4g} | "
                     f"{u['wall_s']:.0f} | {_fmt(u.get('sweep_wall_s'), 4)} |")
    gu, au = use["full grid"], use["adaptive + early stopping"]
    lines += ["", f"Saving: env steps ×{gu['env_steps'] / au['env_steps']:.2f}, FLOPs ×{gu['flops'] / au['flops']:.2f}, "
              f"summed trial wall ×{gu['wall_s'] / max(au['wall_s'], 1e-9):.2f}"
              + (f", sweep wall ×{gu['sweep_wall_s'] / au['sweep_wall_s']:.2f}" if gu.get("sweep_wall_s") and
                 au.get("sweep_wall_s") else ""), ""]
    task = fit_a["tasks"][0]
    sel = {n: f["model_selection"].get(task, {}).get("chosen") for n, f in (("grid", fit_g), ("adaptive", fit_a))}
    lines += [f"Model selection (AICc): grid `{sel['grid']}`, adaptive `{sel['adaptive']}`.", "",
              "| J | quantity | full grid | adaptive | agree |", "|---|---|---|---|---|"]
    n_agree = n_cmp = 0
    rows_g = {r["j_index"]: r for r in fit_g["allocation"].get("per_threshold", [])}
    for r in fit_a["allocation"].get("per_threshold", []):
        rg = rows_g.get(r["j_index"])
        if rg is None:
            continue
        for k in ("sigma", "N"):
            a, b = rg["intervals"][k], r["intervals"][k]
            ag = _agree(a, b)
            n_cmp += ag != "n/a"
            n_agree += ag == "yes"
            lines.append(f"| {r['threshold']:g} | {k}* | {_iv(a)} | {_iv(b)} | {ag} |")
    laws_g = {p["target"]: p for p in fit_g["allocation"].get("power_laws", []) if "params" in p}
    for p in fit_a["allocation"].get("power_laws", []):
        q = laws_g.get(p["target"])
        if q is None or "params" not in p:
            continue
        for label, a, b in ((f"{p['target']}*(F) exponent", q["params"]["s"], p["params"]["s"]),
                            (f"{p['target']}* at F_ref", q["at_F_ref"], p["at_F_ref"])):
            ag = _agree(a, b)
            n_cmp += ag != "n/a"
            n_agree += ag == "yes"
            lines.append(f"| all | {label} | {_iv(a)} | {_iv(b)} | {ag} |")
    lines += ["", f"**{n_agree} of {n_cmp}** compared quantities agree (each estimate inside the other design's "
              "interval)."]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = "\n".join(lines) + "\n"
    atomic_write_text(out / "comparison.md", text)
    (out / "grid_fit.json").write_text(json.dumps(fit_g, indent=1, default=str))
    rows = []
    for name, f, u in (("full grid", fit_g, gu), ("adaptive + early stopping", fit_a, au)):
        w = {p["target"]: (p["params"]["s"]["hi"] - p["params"]["s"]["lo"]) if "params" in p and
             p["params"]["s"].get("lo") is not None else None
             for p in f["allocation"].get("power_laws", []) if p["target"] in ("sigma", "N")}
        rows.append({"design": name, "flops": u["flops"], "widths": w})
    adaptive_plots.plot_comparison(rows, out / "comparison.png", tolerance=design.tolerance)
    print(text)


if __name__ == "__main__":
    main()

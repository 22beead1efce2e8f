"""`scaling-rl fit` and `scaling-rl plot`."""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path


def _floats(text: str) -> list[float]:
    try:
        vals = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not vals:
        raise argparse.ArgumentTypeError("expected at least one number")
    return vals


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "fit", help="fit scaling laws to a sweep and write report.md, fit.json and figures",
        description="Curves -> D_J (isotonic, bootstrap over seeds) -> B*(σ), η*(σ), D_J(σ), D_J(σ,N) with "
                    "bootstrapped intervals -> held-out extrapolation -> compute-optimal σ and N for F = C + δ·D.")
    p.add_argument("results", help="sweep table (.parquet/.csv), a directory holding one or trial directories, "
                                   "or a utd_<σ>/<task>/<metric>/bs_<B>_lr_<η>.npy curve directory")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--metric", default="eval_return", help="metric column / directory (default: eval_return)")
    p.add_argument("--param-count", type=float, default=None, metavar="N",
                   help="model size (parameters) of every curve, for sources without one (a curve directory "
                        "without w<width>p<N>/ level, a table without param_count): enables σ*(F) at that N")
    p.add_argument("--steps", default=None, metavar="START:EVERY",
                   help="the .npy arrays hold seed columns only (no env-step column): row k was logged at "
                        "env step START + k·EVERY")
    p.add_argument("--delta", type=float, default=None,
                   help="cost of one env step in FLOPs (default: the sweep's median 10·N·B·σ)")
    p.add_argument("--thresholds", type=_floats, default=None,
                   help="comma-separated thresholds J in normalised return units (default: chosen per task)")
    p.add_argument("--n-thresholds", type=int, default=5)
    p.add_argument("--spacing", choices=("linear", "log"), default="linear")
    p.add_argument("--normalize", choices=("task", "none"), default="task",
                   help="per-task return normalisation to [0, 1] (default) or raw returns")
    p.add_argument("--interpolation", choices=("log", "linear"), default="log",
                   help="interpolate D_J between log points in log env-steps (default) or linearly")
    p.add_argument("--bootstrap", type=int, default=100, help="bootstrap resamples of seeds (default 100)")
    p.add_argument("--level", type=float, default=0.9, help="interval level (default 0.9)")
    p.add_argument("--loss", choices=("squared", "huber"), default="squared")
    p.add_argument("--huber-delta", type=float, default=0.1, help="Huber threshold in log units")
    p.add_argument("--share-exponents", action="store_true", help="one α (and β) across tasks")
    p.add_argument("--batch-model", choices=("auto", "constant", "power", "sigma_n"), default="auto",
                   help="batch size used in C = 10·N·B·σ·D (auto: fitted B*(σ) if B was swept)")
    p.add_argument("--extrapolate", type=float, default=1.0, metavar="K",
                   help="allow compute-optimal σ*, N* up to a factor K (>= 1) beyond the swept range; every "
                        "extrapolated value is marked (default 1: inside the sweep)")
    p.add_argument("--weights", choices=("auto", "none", "bootstrap"), default="auto",
                   help="weighted least squares by a variance function of log D_J (auto: with >= 4 seeds)")
    p.add_argument("--interp-error", choices=("adaptive", "uniform", "none"), default="adaptive",
                   help="D_J's interpolation uncertainty between log points in the bootstrap: adaptive (default: "
                        "from the gap to a PCHIP cubic's crossing), uniform (a quarter of the bracket), none")
    p.add_argument("--select", choices=("aicc", "full"), default="aicc",
                   help="D_J(σ, N): choose among the nested laws by AICc (default) or always report the full law")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pool-tasks", action="store_true",
                   help="pooled-task mode: divide each task's D_J by its median over the (σ, N) cells, fit one law "
                        "and one σ*(F) across tasks; writes pooled.json and pooled.md")
    p.add_argument("--no-figures", action="store_true")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=run_fit)

    q = subparsers.add_parser("plot", help="redraw the figures of a fit from its fit.json",
                              description="Regenerate every figure (PNG + PDF) from FIT_DIR/fit.json.")
    q.add_argument("fit_dir", help="directory written by `scaling-rl fit` (or its fit.json)")
    q.add_argument("--out", default=None, help="where to write the figures (default: FIT_DIR)")
    q.set_defaults(func=run_plot)


def check_fit_args(args) -> None:
    """The numeric flags no law can use, and an --out that cannot be written: one-line UsageError
    before anything is read or written (Settings.validate checks the rest)."""
    from .. import io
    from ..errors import UsageError

    if not (math.isfinite(args.extrapolate) and args.extrapolate >= 1):
        raise UsageError(f"--extrapolate: {args.extrapolate:g} must be a factor >= 1 (1 = stay inside the sweep)")
    if not (math.isfinite(args.huber_delta) and args.huber_delta > 0):
        raise UsageError(f"--huber-delta: {args.huber_delta:g} must be a finite number > 0 (log units)")
    if args.thresholds is not None:
        bad = [j for j in args.thresholds if not math.isfinite(j)]
        if args.normalize == "task":   # normalised returns lie in [0, 1]: J outside (0, 1] is never (or always) met
            bad = [j for j in args.thresholds if not (math.isfinite(j) and 0 < j <= 1)]
        if bad:
            rule = "in (0, 1] (normalised return units; --normalize none for raw returns)" \
                if args.normalize == "task" else "finite"
            raise UsageError(f"--thresholds: {bad[0]:g} must be {rule}")
    if (problem := io.output_dir_problem(args.out)) is not None:
        raise UsageError(f"--out: {problem}")


def run_fit(args) -> int:
    from ..errors import UsageError
    from .analysis import Settings, analyze
    from .data import load_results
    from .report import write_outputs

    out = Path(args.out)
    check_fit_args(args)
    settings = Settings(thresholds=args.thresholds, n_thresholds=args.n_thresholds, spacing=args.spacing,
                        normalize=args.normalize, interpolation=args.interpolation, n_bootstrap=args.bootstrap,
                        level=args.level, loss=args.loss, huber_delta=args.huber_delta,
                        share_exponents=args.share_exponents, delta=args.delta, batch_model=args.batch_model,
                        seed=args.seed, extrapolate=args.extrapolate, weights=args.weights,
                        interp_error=args.interp_error, select=args.select)
    say = (lambda m: None) if args.quiet else (lambda m: print(f"[scaling-rl fit] {m}", file=sys.stderr, flush=True))
    try:
        settings.validate()
        say(f"loading {args.results} ({args.metric})")
        curves = load_results(args.results, args.metric, param_count=args.param_count, steps=args.steps)
        say(f"{len(curves.curves)} configurations, tasks: {', '.join(curves.tasks)}")
        if getattr(args, "pool_tasks", False):
            from .pooled import pooled_fit, write_pooled
            for path in write_pooled(pooled_fit(curves, settings, progress=say), out):
                print(path)
            return 0
        fit = analyze(curves, settings, progress=say)
    except ValueError as e:  # bad input, reported before anything is written
        raise UsageError(str(e)) from None
    say("writing report, fit.json and figures")
    paths = write_outputs(fit, out, figures=not args.no_figures)
    for path in paths:
        print(path)
    return 0


def run_plot(args) -> int:
    from ..errors import UsageError
    from .plots import plot_all
    from .report import load_fit

    try:
        fit = load_fit(args.fit_dir)
    except ValueError as e:
        raise UsageError(str(e)) from None
    src = Path(args.fit_dir)
    out = Path(args.out) if args.out else (src if src.is_dir() else src.parent)
    from .. import io
    if (problem := io.output_dir_problem(out)) is not None:
        raise UsageError(f"--out: {problem}")
    for path in plot_all(fit, out):
        print(path)
    return 0

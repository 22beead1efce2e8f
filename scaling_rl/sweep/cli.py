"""`scaling-rl sweep run|status|collect`."""
from __future__ import annotations

import json
import sys
from pathlib import Path


def _usage(msg: str):
    from scaling_rl.errors import UsageError
    return UsageError(msg)


def _cmd_run(args) -> int:
    from scaling_rl.sweep import SpecError, load_spec, run_sweep
    from scaling_rl.sweep.collect import format_eta

    if args.workers is not None and args.workers < 0:
        raise _usage(f"--workers: must be >= 0, got {args.workers}")
    from scaling_rl.sweep import memory
    try:
        spec = load_spec(args.spec, out_dir=args.out)
        if args.adaptive and spec.adaptive is None:   # the spec's grid as candidates, default design
            import dataclasses

            from scaling_rl.sweep import adaptive
            spec = dataclasses.replace(spec, adaptive=adaptive.from_spec(
                True, trials=spec.trials, early_stop=spec.early_stop, seeds=spec.trials[0].seeds))
        if spec.adaptive is not None and args.backend == "slurm" and args.no_wait:
            raise SpecError("--no-wait: an adaptive study fits between rounds, so it waits for each round")
        memory.check_spec(spec, args.backend)  # a trial that cannot fit: refuse before any write
    except SpecError as e:
        raise _usage(str(e)) from None
    except ValueError as e:  # e.g. an unreadable $SCALING_RL_MEMORY_BUDGET
        raise _usage(" ".join(str(e).split())) from None
    spec = _check_store(spec, args)
    if args.dry_run and spec.adaptive is None:
        from rich.console import Console
        from rich.table import Table
        axes = sorted({k for t in spec.trials for k in t.axes})
        console = Console()
        console.print(f"{spec.name}: {len(spec.trials)} trials × {spec.trials[0].seeds} seeds "
                      f"({spec.agent}) -> {spec.out_dir}", soft_wrap=True)
        table = Table()
        for col in ("trial", *axes):
            table.add_column(col)
        for t in spec.trials:
            table.add_row(t.id, *(str(t.axes.get(a, "")) for a in axes))
        console.print(table)
        return 0
    if spec.adaptive is not None:
        return _run_adaptive(spec, args)
    summary = run_sweep(spec, backend=args.backend, workers=args.workers, progress=not args.no_progress,
                        retry_diverged=args.retry_diverged, ray_address=args.ray_address,
                        wait=not args.no_wait)
    c = summary["counts"]
    print(f"sweep {spec.name}: " + " ".join(f"{k}={v}" for k, v in c.items() if v)
          + f" -> {spec.out_dir}" + ("" if not (c["pending"] or c["running"]) else
                                     f" (eta {format_eta(summary['eta_s'])})"))
    return 0 if c["failed"] == 0 else 1


def _check_store(spec, args):
    """Refuse, before anything is written, a store that is not this spec's (another sweep, a `train`
    run, an unreadable sweep.json: unless --force), one of whose trials this spec would run is
    unreadable, or an out_dir that cannot be written. Returns the spec with its resolved name in the
    record (`raw`), so sweep.json always says whose store it is."""
    import dataclasses

    from scaling_rl import io
    from scaling_rl.sweep.store import Store

    store = Store(spec.out_dir)
    if not args.force and (why := store.foreign(spec.name, spec.agent)) is not None:
        raise _usage(f"out_dir: {why}")
    for t in spec.trials:
        if store.trial_dir(t.id).exists() and (why := store.unreadable(t.id)) is not None:
            raise _usage(f"out_dir: trial {t.id}: {why}; remove that trial directory to rerun it")
    if not args.dry_run and (problem := io.output_dir_problem(spec.out_dir)) is not None:
        raise _usage(f"out_dir: {problem}")
    return dataclasses.replace(spec, raw={**spec.raw, "name": spec.name})


def _run_adaptive(spec, args) -> int:
    """Round by round (resumable): run the proposals, fit, propose; figures and state in <out>/adaptive."""
    from scaling_rl.sweep import adaptive, adaptive_plots

    if args.dry_run:
        cells = adaptive.initial_cells(spec.adaptive, adaptive.cells_of(spec.trials))
        print(f"{spec.name}: adaptive study over {len(spec.trials)} candidate trials; initial design "
              f"{len(cells)} cells: " + ", ".join(f"(σ={c.sigma:g}, N={c.N:.4g})" for c in cells))
        return 0
    state = adaptive.run_adaptive(spec, backend=args.backend, workers=args.workers, progress=not args.no_progress,
                                  retry_diverged=args.retry_diverged, ray_address=args.ray_address)
    cells = [c.key for c in adaptive.cells_of(spec.trials)]
    figs = adaptive_plots.write_figures(spec.out_dir, state, candidates=cells)
    last = state["rounds"][-1]
    print(f"adaptive {spec.name}: {len(state['rounds'])} round(s), {last['fit']['trials']} trials, "
          f"{last['fit']['flops']:.3g} FLOPs, {last['fit']['env_steps']:.3g} env steps; {last['decision']} -> "
          f"{spec.out_dir}/adaptive ({', '.join(p.name for p in figs)})")
    return 0


def _store_dir(path: str) -> Path:
    p = Path(path)
    if not (p / "trials").is_dir():
        raise _usage(f"{path}: not a sweep directory (no trials/ inside); give the spec's out_dir")
    return p


def _cmd_status(args) -> int:
    from scaling_rl.sweep.collect import format_eta, status_summary

    s = status_summary(_store_dir(args.dir))
    bad = s["unreadable"]
    if args.json:
        print(json.dumps(s, indent=2, default=str))
        return _unreadable_error(bad)
    from rich.console import Console
    from rich.table import Table
    table = Table(title=f"sweep {s['root']}: {s['total']} trials")
    table.add_column("status")
    table.add_column("trials", justify="right")
    table.add_column("share", justify="right")
    for state, n in s["counts"].items():
        if n or state in ("pending", "running", "done"):   # `unreadable` only when there is one
            table.add_row(state, str(n), f"{100 * n / max(1, s['total']):.0f}%")
    console = Console()
    console.print(table)
    mean = s["mean_trial_s"]
    console.print(f"mean trial {mean:.1f}s · ETA {format_eta(s['eta_s'])}" if mean else
                  f"ETA {format_eta(s['eta_s'])} (no finished trial yet)")
    for tid, step in s["diverged"]:
        console.print(f"diverged: {tid} at env step {step}")
    es = s.get("early_stop") or {}
    if es.get("stopped"):
        flops = es.get("saved_flops")
        console.print(f"stopped early: {es['stopped']} ({es.get('reached', 0)} reached, "
                      f"{es.get('unreachable', 0)} censored as unreachable) · saved "
                      f"{es.get('saved_env_steps', 0):,} env steps"
                      + (f", {flops:.3g} FLOPs" if flops else ""))
    if args.trials:
        from scaling_rl.sweep.store import Store
        store = Store(args.dir)
        why = dict(bad)
        axes = sorted({k for t in store.trial_ids() if t not in why for k in store.trial(t).axes})
        per = Table(title="trials")
        per.add_column("trial", no_wrap=True)
        for col in (*axes, "status", "stopped", "attempts", "wall_s", "host", "error"):
            per.add_column(col)
        for tid in store.trial_ids():
            if tid in why:   # listed as such, with the reason; the others as usual
                per.add_row(tid, *("" for _ in axes), "unreadable", "", "", "", "", why[tid][-60:])
                continue
            st, trial = store.status(tid), store.trial(tid)
            stopped = ""   # early stopping: reason @ env step (saved env steps)
            if st.get("stopped_early"):
                stopped = f"{st['stopped_early']} @ {st.get('stop_step')} (saved {st.get('saved_env_steps')})"
            per.add_row(tid, *(str(trial.axes.get(a, "")) for a in axes), store.effective_state(tid, st),
                        stopped, str(st.get("attempts", 0)), str(st.get("wall_s", "")), str(st.get("host", "")),
                        str(st.get("error") or "")[:60])
        console.print(per)
    return _unreadable_error(bad)


def _unreadable_error(bad) -> int:
    """Exit 0, or (a trial's files are corrupt) one line naming it on stderr and exit 2."""
    if not bad:
        return 0
    more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
    msg = " ".join(f"{len(bad)} trial(s) unreadable: {bad[0][0]}: {bad[0][1]}{more}".split())
    print(f"scaling-rl: error: {msg}", file=sys.stderr)
    return 2


def _cmd_collect(args) -> int:
    from scaling_rl.sweep.collect import RESULTS, collect

    from scaling_rl.sweep.collect import check_results_path

    root = _store_dir(args.dir)
    out = args.out or str(root / RESULTS)
    if (problem := check_results_path(root, out)) is not None:
        raise _usage(problem)
    df = collect(root, out=out, progress=not args.no_progress)   # CorruptFile: one line, nothing written
    n_trials = df["trial_id"].nunique() if len(df) else 0
    print(f"{out}: {len(df)} rows from {n_trials} trials")
    return 0


def register(subparsers) -> None:
    """Add `sweep run|status|collect` to the `scaling-rl` parser."""
    p = subparsers.add_parser("sweep", help="run / inspect / collect sweeps",
                              description="Run a sweep spec on a backend, inspect a store, collect results.")
    sub = p.add_subparsers(dest="sweep_command", metavar="{run,status,collect}")
    p.set_defaults(func=lambda a: (p.print_help(sys.stderr), 2)[1])

    r = sub.add_parser("run", help="run every unfinished trial of a spec (resumable)")
    r.add_argument("spec", help="sweep spec (YAML)")
    r.add_argument("--backend", choices=("local", "slurm", "ray"), default=None,
                   help="where trials run (default: the spec's backend.name, else local)")
    r.add_argument("--workers", type=int, default=None,
                   help="local worker processes (0: run the trials one by one in this process, "
                        "no pool) / slurm array parallelism (0: all trials)")
    r.add_argument("--dry-run", action="store_true", help="validate and list the trials; write nothing")
    r.add_argument("--out", default=None, help="store directory (overrides the spec's out_dir)")
    r.add_argument("--ray-address", default=None, help="Ray cluster address (default: start a local one)")
    r.add_argument("--retry-diverged", action="store_true", help="rerun diverged trials too")
    r.add_argument("--no-wait", action="store_true", help="slurm: submit and return")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.add_argument("--force", action="store_true",
                   help="run in an out_dir that holds another sweep (or a train run, or an unreadable "
                        "sweep.json): add this spec's trials there and rewrite its sweep.json")
    r.add_argument("--adaptive", action="store_true",
                   help="run the spec's grid as an adaptive study (default design; see sweep.adaptive); "
                        "a spec with an `adaptive:` block is always run adaptively")
    r.set_defaults(func=_cmd_run)

    s = sub.add_parser("status", help="counts per status and ETA of a sweep directory")
    s.add_argument("dir")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.add_argument("--trials", action="store_true", help="also list every trial")
    s.set_defaults(func=_cmd_status)

    c = sub.add_parser("collect", help="one tidy parquet table for the whole sweep")
    c.add_argument("dir")
    c.add_argument("--out", default=None, help="output parquet (default: DIR/results.parquet)")
    c.add_argument("--no-progress", action="store_true")
    c.set_defaults(func=_cmd_collect)

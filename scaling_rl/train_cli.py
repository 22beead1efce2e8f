"""`scaling-rl train`: one agent configuration from the command line (flags and `--set KEY=VALUE`),
run by `train.run`, as one process or as N JAX processes (`--processes`, or under `srun -n N`)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import types
from pathlib import Path
from typing import Any

from scaling_rl import io
from scaling_rl.agent_config import ConfigError, _one_line, make_config
from scaling_rl.train import Diverged, run

_FLAG_FIELDS = (("env", "env"), ("width", "width"), ("depth", "depth"), ("utd", "utd"),
                ("batch_size", "batch_size"), ("lr", "lr"), ("env_steps", "env_steps"),
                ("eval_schedule", "eval_schedule"), ("eval_points", "eval_points"))


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse prints usage as well by default)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


def register(subparsers) -> None:
    """Add `scaling-rl train`."""
    p = subparsers.add_parser(
        "train", help="train one agent configuration (seeds vmapped), resumable",
        description="Train N seeds of one agent config in one compiled program; writes config.json, "
                    "metrics.parquet, checkpoints/, curve.png, status.json into --out. Rerun the same "
                    "command to resume.")
    p.error = types.MethodType(_OneLineParser.error, p)
    p.add_argument("--agent", required=True, help="agent name (scaling_rl.agents.<name>)")
    p.add_argument("--env", help="environment, e.g. gymnax/Pendulum-v1")
    p.add_argument("--width", help="backbone width")
    p.add_argument("--depth", help="backbone depth")
    p.add_argument("--utd", help="update-to-data ratio (gradient steps per env step)")
    p.add_argument("--batch-size", dest="batch_size", help="minibatch size")
    p.add_argument("--lr", help="learning rate")
    p.add_argument("--env-steps", dest="env_steps", help="env steps per seed")
    p.add_argument("--seeds", type=int, default=1, help="number of seeds (vmapped), default 1")
    p.add_argument("--seed", type=int, default=0, help="root seed, default 0")
    p.add_argument("--out", required=True, help="run directory (resumed when it exists)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="any other Config field, typed by the field (repeatable)")
    p.add_argument("--checkpoint-every", type=int, default=1, help="chunks between checkpoints")
    p.add_argument("--eval-every", type=int, default=1,
                   help="chunks between evaluations (eval_schedule linear)")
    p.add_argument("--eval-schedule", dest="eval_schedule",
                   help="linear (every --eval-every chunks, the default) or log (--eval-points "
                        "chunks, log-spaced in env steps; the last chunk always)")
    p.add_argument("--eval-points", dest="eval_points", help="evaluations of the log schedule (default 16)")
    p.add_argument("--wandb", action="store_true", help="log to wandb (offline unless WANDB_MODE=online)")
    p.add_argument("--wandb-project", default=None, help="wandb project (default scaling_rl)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--processes", type=int, default=1,
                   help="run the trial as N JAX processes on this machine (coordinator on localhost, "
                        "gloo collectives on CPU); needs --set data_parallel=true. Under `srun -n N` "
                        "the processes come from Slurm instead (scaling_rl/multiprocess.py)")
    p.set_defaults(func=_main, parser=p)


def _argv(args: argparse.Namespace) -> list[str]:
    """The `train` command line that `args` was parsed from (for the processes `launch` starts)."""
    argv = ["train"]
    for action in args.parser._actions:
        if not action.option_strings or action.dest in ("help", "func", "parser"):
            continue
        value, flag = getattr(args, action.dest, None), action.option_strings[0]
        if isinstance(action, argparse._StoreTrueAction):
            argv += [flag] if value else []
        elif isinstance(action, argparse._AppendAction):
            for item in value or ():
                argv += [flag, str(item)]
        elif value is not None and value != action.default:
            argv += [flag, str(value)]
    return argv


def _mark_failed(out: Path, error: str) -> None:
    """After a multi-process trial failed: a status.json its processes left at `running` (process 0
    killed before it could write `failed`) says `failed`, so no reader takes the run for live."""
    path = out / "status.json"
    try:
        status = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if status.get("status") == "running":
        io.atomic_write_json(path, {**status, "status": "failed", "error": error})


def _main(args: argparse.Namespace) -> int:
    from scaling_rl.errors import UsageError

    overrides: dict[str, Any] = {}
    for flag, field in _FLAG_FIELDS:
        value = getattr(args, flag)
        if value is not None:
            overrides[field] = value
    for item in args.overrides:
        if "=" not in item:
            raise UsageError(f"--set {item}: expected KEY=VALUE")
        key, value = item.split("=", 1)
        key = key.strip().replace("-", "_")
        if key in overrides:
            raise UsageError(f"--set {key}: given twice")
        overrides[key] = value
    from scaling_rl import multiprocess

    joined = multiprocess.requested_processes()   # > 1: one of several processes (launched or srun)
    if args.processes < 1:
        raise UsageError(f"--processes: must be >= 1, got {args.processes}")
    if joined > 1 and args.processes not in (1, joined):
        raise UsageError(f"--processes {args.processes}: this process is one of {joined} "
                         "(srun -n / the launcher); drop --processes or make them agree")
    n_processes = max(joined, args.processes)
    if joined > 1:   # before anything (agent modules included) touches a JAX device
        try:
            multiprocess.initialize()
        except Exception as e:  # noqa: BLE001 - e.g. the coordinator never came up
            print(f"scaling-rl: error: process could not join the others: {_one_line(e)}", file=sys.stderr)
            return 1
    if n_processes > 1:
        try:
            cfg = make_config(args.agent, overrides)
        except ConfigError as e:
            raise UsageError(str(e)) from None
        if not getattr(cfg, "data_parallel", False):
            raise UsageError(f"--processes {n_processes}: the learner must span the processes; "
                             "add --set data_parallel=true")
        if joined == 1:   # start the processes: each reruns this command as one of them
            code = multiprocess.launch(_argv(args), n_processes)
            if code:
                _mark_failed(Path(args.out), f"process failure (exit code {code}); see stderr")
            return code
    wandb_opts: bool | dict = False
    if args.wandb:
        wandb_opts = {"project": args.wandb_project} if args.wandb_project else True
    try:
        cfg = make_config(args.agent, overrides)
        df = run(args.agent, cfg, args.out, args.seeds, seed=args.seed, wandb=wandb_opts,
                 progress=not args.no_progress, checkpoint_every=args.checkpoint_every,
                 eval_every=args.eval_every)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    except Diverged as e:
        print(f"scaling-rl: {e}; metrics so far in {args.out}", file=sys.stderr)
        return 3
    except Exception as e:  # noqa: BLE001
        if n_processes == 1:
            raise
        # a peer died (its collectives or heartbeat fail here) or a shared error: one line, non-zero
        import jax

        print(f"scaling-rl: error: process {jax.process_index()} of {n_processes}: "
              f"{type(e).__name__}: {_one_line(e)}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        # exit now: JAX's shutdown barrier at interpreter exit would wait for the dead peer and abort
        os._exit(1)
    if not multiprocess.is_primary():
        return 0
    summary = json.loads((Path(args.out) / "status.json").read_text()).get("summary", {})
    shown = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in summary.items()}
    print(f"done: {args.out}  " + "  ".join(f"{k}={v}" for k, v in shown.items()))
    del df
    return 0

"""`scaling-rl grpo` (train / resume a GRPO run), `scaling-rl dpo` (a DPO run with a batch
scheduler) and `scaling-rl passk` (pass@k of a saved policy).

    scaling-rl grpo --out runs/grpo steps=40 loss_type=dapo group_size=8
    scaling-rl grpo --out runs/grpo --config grpo.yaml lr=3e-4       # file, then overrides
    scaling-rl dpo --out runs/dpo scheduler=sams noise=0.2 beta=0.1
    scaling-rl passk --model runs/grpo/base_model --n 256 --problems 64 --out base_passk.csv

Heavy imports (torch, transformers) happen inside the commands, so `scaling-rl --help` stays fast.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def _usage_error(msg: str):
    from scaling_rl.errors import UsageError
    return UsageError(msg)


def parse_overrides(items: list[str]) -> dict:
    """["a=1", "b=dapo"] -> {"a": 1, "b": "dapo"}; values are parsed as YAML scalars."""
    import yaml
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise _usage_error(f"override {item!r} is not KEY=VALUE (e.g. steps=40)")
        try:
            out[key.strip()] = yaml.safe_load(value) if value != "" else ""
        except yaml.YAMLError:
            raise _usage_error(f"override {item!r}: value is not a valid scalar") from None
    return out


def load_config_file(path: str) -> dict:
    import yaml
    p = Path(path)
    if not p.is_file():
        raise _usage_error(f"--config {path}: no such file")
    try:
        data = json.loads(p.read_text()) if p.suffix == ".json" else yaml.safe_load(p.read_text())
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise _usage_error(f"--config {path}: cannot parse ({type(e).__name__})") from None
    if not isinstance(data, dict):
        raise _usage_error(f"--config {path}: expected a mapping of config keys")
    return data


# The record each trainer keeps in its run directory; what other commands leave there (a train run or a
# sweep trial: config.json / status.json; a sweep store: trials/, sweep.json; a saved model: config.json).
_OWN_RECORD = {"grpo": "grpo_config.json", "dpo": "dpo_config.json"}
_FOREIGN = ("config.json", "status.json", "sweep.json", "trials")


def check_run_dir(out: str, kind: str) -> None:
    """Refuse (one line, before anything is written) an --out that cannot be written, holds another
    kind of run (a train run, a sweep store or trial, a saved model, the other trainer's run), or
    holds this trainer's record unreadable."""
    from scaling_rl import io
    from scaling_rl.errors import CorruptFile

    if (problem := io.output_dir_problem(out)) is not None:
        raise _usage_error(f"--out: {problem}")
    d = Path(out)
    if not d.is_dir():
        return
    others = [f for f in (*_FOREIGN, *(r for k, r in _OWN_RECORD.items() if k != kind)) if (d / f).exists()]
    own = d / _OWN_RECORD[kind]
    if others or ((d / "metrics.parquet").exists() and not own.exists()):
        what = others[0] if others else "metrics.parquet"
        raise _usage_error(f"--out {out}: holds {what}, not a {kind} run's files (a train run, sweep, saved "
                           f"model or another trainer's run?); give a new directory")
    if own.exists():
        try:
            io.read_json_object(own, what=f"a {kind} config")
        except CorruptFile as e:
            raise _usage_error(f"--out: {e}; use a new directory (or remove the file)") from None


def _config_and_run(args, config_cls, run):
    """The config from --config and KEY=VALUE overrides, then `run(config, args.out)`; bad keys or
    values and a bad out_dir become one-line usage errors. Returns (config, metrics frame)."""
    cfg = load_config_file(args.config) if args.config else {}
    cfg.update(parse_overrides(args.overrides))
    try:
        config = config_cls.from_dict(cfg)
    except (ValueError, TypeError) as e:
        raise _usage_error(str(e).splitlines()[0]) from None
    try:
        return config, run(config, args.out, progress=not args.quiet)
    except ValueError as e:
        if str(e).startswith("out_dir:"):
            raise _usage_error(str(e)) from None
        raise


def cmd_grpo(args) -> int:
    check_run_dir(args.out, "grpo")   # before torch / transformers are imported
    from scaling_rl.llm.grpo_run import run
    from scaling_rl.llm.grpo_config import GRPOConfig
    _, df = _config_and_run(args, GRPOConfig, run)
    rewards = df["reward"].dropna() if "reward" in df else []
    acc = df["eval/accuracy"].dropna()
    print(f"grpo: {len(rewards)} steps  reward {rewards.iloc[0] if len(rewards) else float('nan'):.3f}"
          f" -> {rewards.iloc[-1] if len(rewards) else float('nan'):.3f}  eval accuracy "
          f"{acc.iloc[0]:.3f} -> {acc.iloc[-1]:.3f}  run dir {args.out}")
    return 0


def cmd_dpo(args) -> int:
    check_run_dir(args.out, "dpo")
    from scaling_rl.llm.dpo import DPOConfig, run
    config, df = _config_and_run(args, DPOConfig, run)
    ev = df.dropna(subset=["eval/pref_accuracy"])
    print(f"dpo ({config.scheduler}, noise {config.noise}): {int(df['step'].max())} steps  held-out "
          f"preference accuracy {ev['eval/pref_accuracy'].iloc[0]:.3f} -> "
          f"{ev['eval/pref_accuracy'].iloc[-1]:.3f}  task accuracy {ev['eval/accuracy'].iloc[0]:.3f}"
          f" -> {ev['eval/accuracy'].iloc[-1]:.3f}  run dir {args.out}")
    return 0


def _parse_ks(text: str, n: int) -> list[int]:
    from scaling_rl.llm.passk import powers_of_two
    if not text:
        return powers_of_two(n)
    try:
        ks = sorted({int(k) for k in text.split(",")})
    except ValueError:
        raise _usage_error(f"--k {text!r}: expected comma-separated integers") from None
    if ks[0] < 1 or ks[-1] > n:
        raise _usage_error(f"--k: every k must be in [1, n={n}]")
    return ks


def cmd_passk(args) -> int:
    out = Path(args.out)
    if out.suffix not in (".csv", ".json", ".parquet"):
        raise _usage_error(f"--out {args.out}: use a .csv, .json or .parquet file")
    from scaling_rl.io import output_file_problem
    if (problem := output_file_problem(out)) is not None:
        raise _usage_error(f"--out: {problem}")
    if not (Path(args.model) / "config.json").is_file():
        raise _usage_error(f"--model {args.model}: not a saved policy directory (no config.json)")
    if args.n < 1 or args.problems < 1:
        raise _usage_error("--n and --problems must be >= 1")
    ks = _parse_ks(args.k, args.n)
    import pandas as pd
    import torch

    from scaling_rl import io as sio
    from scaling_rl.llm.models import load_policy
    from scaling_rl.llm.passk import pass_at_k_curve
    from scaling_rl.llm.rollout import completion_budget, correct_counts
    from scaling_rl.llm.tasks import make_task
    try:
        task = make_task(args.task, digits=args.digits, countdown_numbers=args.countdown_numbers)
    except ValueError as e:
        raise _usage_error(str(e)) from None
    torch.set_num_threads(args.threads)
    model, tok = load_policy(args.model)
    try:
        budget = completion_budget(args.max_completion_length, task, tok)
    except ValueError as e:
        raise _usage_error(str(e)) from None
    problems = task.problems("test", args.problems, seed=args.seed)
    counts = correct_counts(model, tok, task, problems, n=args.n, max_new_tokens=budget,
                            temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    curve = pass_at_k_curve(counts, args.n, ks)
    df = pd.DataFrame({"k": list(curve), "pass_at_k": list(curve.values())})
    if out.suffix == ".csv":
        sio.atomic_write_text(out, df.to_csv(index=False))
    elif out.suffix == ".json":
        sio.atomic_write_json(out, {"model": args.model, "n": args.n, "problems": len(problems),
                                    "pass_at_k": {str(k): v for k, v in curve.items()}})
    else:
        sio.atomic_write_parquet(out, df)
    for k, v in curve.items():
        print(f"pass@{k:<4d} {v:.4f}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("grpo", help="train or resume a GRPO run on a transformers model",
                              description=cmd_grpo.__doc__ or __doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="run directory (resumed when it exists)")
    p.add_argument("--config", help="JSON or YAML file of GRPOConfig keys")
    p.add_argument("--quiet", action="store_true", help="no per-step progress lines")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides")
    p.set_defaults(func=cmd_grpo)

    d = subparsers.add_parser("dpo", help="train a DPO run (scheduler=uniform|sams|small_loss)",
                              description="DPO (policy + frozen reference) whose training "
                              "batches a scheduler picks; config keys: scaling_rl/llm/dpo.py "
                              "DPOConfig")
    d.add_argument("--out", required=True, help="run directory (a finished one is not rerun)")
    d.add_argument("--config", help="JSON or YAML file of DPOConfig keys")
    d.add_argument("--quiet", action="store_true", help="no progress lines")
    d.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides")
    d.set_defaults(func=cmd_dpo)

    q = subparsers.add_parser("passk", help="unbiased pass@k of a saved policy on held-out problems")
    q.add_argument("--model", required=True, help="saved policy directory (e.g. RUN/base_model)")
    q.add_argument("--out", required=True, help="table to write (.csv, .json or .parquet)")
    q.add_argument("--task", default="addition", help="addition | countdown")
    q.add_argument("--digits", type=int, default=2)
    q.add_argument("--countdown-numbers", type=int, default=3)
    q.add_argument("--problems", type=int, default=64)
    q.add_argument("--n", type=int, default=256, help="samples per problem (max k)")
    q.add_argument("--k", default="", help="comma-separated k values (default: powers of two to n)")
    q.add_argument("--temperature", type=float, default=1.0)
    q.add_argument("--top-p", type=float, default=1.0)
    q.add_argument("--max-completion-length", type=int, default=0)
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--threads", type=int, default=1)
    q.set_defaults(func=cmd_passk)

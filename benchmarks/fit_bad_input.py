"""`scaling-rl fit` on bad user data: every case must end in exit 0, or exit 2 with ONE line on stderr.

Builds 33 sources from one small synthetic study (3 tasks x 4 sigma, one unnamed model size, 3 seeds): curve
directories with NaN/0/negative/inf sigma, zero or partial model sizes, zero batch size, negative lr, one seed,
flat/decreasing/two-point/negative-step/duplicate-step/inf curves, missing cells, one task, ...; tables with
text, NaN, zero and negative values. Each runs in-process through `scaling_rl.cli.main` in 4 modes (plain,
--param-count, --pool-tasks, both). Prints one row per (case, mode): rc, ok | ONE-LINE | MULTI-LINE | CRASH,
and the message; the last line counts them. ~1 min on 2 CPU cores.

    .venv/bin/python benchmarks/fit_bad_input.py [case ...]
"""
import contextlib
import io
import shutil
import sys
import tempfile
import traceback
from collections import Counter
from pathlib import Path

import numpy as np

from scaling_rl.cli import main
from scaling_rl.scaling import data, synthetic

T = Path(tempfile.mkdtemp(prefix="fit_bad_input_"))
base = synthetic.make_study(synthetic.Truth(), utds=[0.5, 1, 2, 4], param_counts=[1.5e5], batch_sizes=[256.0],
                            lrs=[3e-4], tasks=["hop", "run", "walk"], seeds=3, n_log=30, log_spaced=True, rng=1)
for c in base.curves: c.param_count = float("nan")

def npy(name, mutate=None, curves=None):
    root = T / name
    cs = data.CurveSet([data.Curve(**{**c.__dict__}) for c in (curves or base.curves)], base.metric)
    if mutate: mutate(root, cs)
    else: data.write_npy_dir(cs, root)
    return root

def save(root, c, rel=None, arr=None):
    rel = rel or f"utd_{c.utd:g}/{c.task}/eval_return/bs_{c.batch_size:g}_lr_{c.lr:g}.npy"
    p = root / rel; p.parent.mkdir(parents=True, exist_ok=True)
    np.save(p, np.column_stack([c.steps, c.returns]) if arr is None else arr)

def rename_utd(new):
    def m(root, cs):
        for i, c in enumerate(cs.curves):
            save(root, c, rel=f"utd_{new if c.utd == 0.5 else f'{c.utd:g}'}/{c.task}/eval_return/bs_256_lr_0.0003.npy")
    return m

def model_dir(d, partial=False):
    def m(root, cs):
        for i, c in enumerate(cs.curves):
            pre = "" if (partial and i % 2) else d + "/"
            save(root, c, rel=pre + f"utd_{c.utd:g}/{c.task}/eval_return/bs_256_lr_0.0003.npy")
    return m

def fname(stem):
    def m(root, cs):
        for i, c in enumerate(cs.curves):
            save(root, c, rel=f"utd_{c.utd:g}/{c.task}/eval_return/{stem if i == 0 else 'bs_256_lr_0.0003'}.npy")
    return m

def arrays(f):
    def m(root, cs):
        for i, c in enumerate(cs.curves):
            save(root, c, arr=f(i, c))
    return m

def drop(pred):
    def m(root, cs):
        for c in cs.curves:
            if not pred(c): save(root, c)
    return m

cases = {
    "utd_nan": npy("utd_nan", rename_utd("nan")),
    "utd_0": npy("utd_0", rename_utd("0")),
    "utd_neg": npy("utd_neg", rename_utd("-1")),
    "utd_inf": npy("utd_inf", rename_utd("inf")),
    "p0": npy("p0", model_dir("w64p0")),
    "pnan": npy("pnan", model_dir("w64pnan")),
    "pinf": npy("pinf", model_dir("w64pinf")),
    "p_partial": npy("p_partial", model_dir("w64p150000", partial=True)),
    "bs_nan": npy("bs_nan", fname("bs_nan_lr_0.0003")),
    "bs_0": npy("bs_0", fname("bs_0_lr_0.0003")),
    "lr_neg": npy("lr_neg", fname("bs_256_lr_-1")),
    "one_seed": npy("one_seed", arrays(lambda i, c: np.column_stack([c.steps, c.returns[:, 0]]))),
    "flat": npy("flat", arrays(lambda i, c: np.column_stack([c.steps, 0 * c.returns + 0.1]))),
    "decreasing": npy("decreasing", arrays(lambda i, c: np.column_stack([c.steps, c.returns[::-1]]))),
    "two_rows": npy("two_rows", arrays(lambda i, c: np.column_stack([c.steps, c.returns])[[0, -1]])),
    "neg_steps": npy("neg_steps", arrays(lambda i, c: np.column_stack([c.steps - c.steps[-1] / 2, c.returns]))),
    "dup_steps": npy("dup_steps", arrays(lambda i, c: np.column_stack([np.repeat(c.steps[::2], 2)[:len(c.steps)], c.returns]))),
    "inf_returns": npy("inf_returns", arrays(lambda i, c: np.column_stack([c.steps, np.where(c.returns > 0.5, np.inf, c.returns)]))),
    "one_sigma": npy("one_sigma", drop(lambda c: c.utd != 1)),
    "task_missing_sigma": npy("task_missing_sigma", drop(lambda c: c.task == "run" and c.utd == 4)),
    "one_task": npy("one_task", drop(lambda c: c.task != "hop")),
    "unequal_seeds": npy("unequal_seeds", arrays(lambda i, c: np.column_stack([c.steps, c.returns[:, : 1 + i % 3]]))),
    "empty_arr": npy("empty_arr", arrays(lambda i, c: np.zeros((0, 4)) if i == 0 else np.column_stack([c.steps, c.returns]))),
    "3d": npy("3d", arrays(lambda i, c: np.zeros((3, 4, 2)) if i == 0 else np.column_stack([c.steps, c.returns]))),
    "ok": npy("ok"),
}
tab = base.to_table().drop(columns=["param_count"])
def tcase(name, df):
    p = T / f"{name}.csv"; df.to_csv(p, index=False); cases[name] = p
tcase("t_utd_str", tab.assign(utd=tab["utd"].astype(str).replace("0.5", "half")))
tcase("t_pc_some_nan", tab.assign(param_count=np.where(tab["utd"] == 1, np.nan, 1.5e5)))
tcase("t_pc_zero", tab.assign(param_count=0.0))
tcase("t_pc_neg", tab.assign(param_count=np.where(tab["utd"] == 1, -5.0, 1.5e5)))
tcase("t_utd_nan", tab.assign(param_count=1.5e5, utd=np.where(tab["utd"] == 1, np.nan, tab["utd"])))
tcase("t_steps_str", tab.assign(param_count=1.5e5, env_steps=tab["env_steps"].astype(str) + "x"))
tcase("t_bs_str", tab.assign(param_count=1.5e5, batch_size="big"))
tcase("t_noseedvar", tab.assign(param_count=1.5e5).drop(columns=["seed"]))

extra_sets = {"pool": ["--pool-tasks"], "pool_pc": ["--pool-tasks", "--param-count", "150000", "--delta", "4e9"],
              "plain": [], "plain_pc": ["--param-count", "150000"]}
only = sys.argv[1:] or None
tally = Counter()
for name, path in cases.items():
    if only and name not in only: continue
    for mode, ex in extra_sets.items():
        out = T / "out" / f"{name}_{mode}"
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                rc = main(["fit", str(path), "--out", str(out), "--bootstrap", "10", "--n-thresholds", "3",
                           "--no-figures", "--quiet", *ex])
            e = err.getvalue().strip()
            kind = "ok" if rc == 0 else ("ONE-LINE" if len(e.splitlines()) == 1 else "MULTI-LINE")
            msg = e.splitlines()[0][:160] if e else ""
        except SystemExit as s:
            rc, kind, msg = s.code, "exit", err.getvalue().strip()[:160]
        except Exception as x:
            tb = traceback.extract_tb(x.__traceback__)[-1]
            rc, kind, msg = "-", "CRASH", f"{type(x).__name__}: {str(x)[:100]} @ {Path(tb.filename).name}:{tb.lineno}"
        tally[kind] += 1
        print(f"{name:20s} {mode:8s} rc={rc} {kind:10s} {msg}", flush=True)
shutil.rmtree(T, ignore_errors=True)
print("total:", dict(tally), "(pass: only ok and ONE-LINE)")
sys.exit(0 if set(tally) <= {"ok", "ONE-LINE"} else 1)

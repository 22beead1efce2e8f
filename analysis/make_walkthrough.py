"""Build analysis/walkthrough.ipynb from the cell sources below and execute it: edit here, then run
`make notebook` (= this file). The notebook is committed WITH its outputs (tables, figures) on its own small
seeded synthetic sweep; tests/test_scaling_notebook.py re-executes it and checks that the committed outputs
are exactly what it produces (text and table outputs verbatim, figures by count), so after any change to
the analysis the committed notebook must be regenerated with `make notebook`."""
import contextlib
import os
import re
import sys
import tempfile
from pathlib import Path

import nbformat as nbf

CELLS = [
    ("md", """# Scaling-law walkthrough: from a sweep to N and σ for a budget

1. load a sweep's learning curves,
2. turn them into data efficiency D_J (env steps to reach a return threshold J),
3. fit D_J(σ, N) = D_min·(1 + (a/σ)^α + (b/N)^β) with bootstrapped intervals,
4. plot, and
5. choose the model size N and UTD ratio σ for a compute budget F = C + δ·D.

The sweep is read from `$SCALING_RL_RESULTS` (a sweep table or curve directory). Without it the notebook
makes a small synthetic sweep whose true law is known, so it runs anywhere in well under a minute."""),
    ("code", """import os, tempfile
from pathlib import Path

import pandas as pd
from IPython.display import Image, display

from scaling_rl import scaling
from scaling_rl.scaling import plots, synthetic

results = os.environ.get("SCALING_RL_RESULTS")
if not results:
    results = Path(tempfile.mkdtemp()) / "results.parquet"
    synthetic.make_table(synthetic.Truth(), utds=[0.5, 1, 2, 4], param_counts=[1e5, 3e5, 1e6],
                         batch_sizes=[256, 512], lrs=[3e-4], seeds=3, n_log=60, return_scale=100).to_parquet(results)
n_bootstrap = int(os.environ.get("SCALING_RL_BOOTSTRAP", "40"))
out_dir = Path(os.environ.get("SCALING_RL_OUT") or tempfile.mkdtemp())
print(results if os.environ.get("SCALING_RL_RESULTS") else "a seeded synthetic sweep with a known law")"""),
    ("md", """## 1. Load
`load_results` accepts the sweep store's tidy table (one row per trial, seed and log point), a directory holding
it, or a published `utd_<σ>/<task>/<metric>/bs_<B>_lr_<η>.npy` curve directory. One `Curve` per configuration."""),
    ("code", """curves = scaling.load_results(results, metric="eval_return")
summary = pd.DataFrame([{"task": c.task, "σ": c.utd, "N": c.param_count, "B": c.batch_size, "η": c.lr,
                         "seeds": c.n_seeds, "last step": c.steps[-1]} for c in curves.curves])
print(len(curves.curves), "configurations;", "tasks:", curves.tasks)
summary.head()"""),
    ("md", """## 2–3. Data efficiency and fits
`analyze` normalises returns per task, picks thresholds up to the level every (σ, N) reaches, computes D_J
from the isotonic seed-mean curve (bootstrapping seeds), chooses the best B and η per (σ, N) in every
bootstrap sample, selects between the nested laws of D_J(σ, N) by AICc, and fits the chosen law with one
estimator (start grid → Levenberg–Marquardt → L-BFGS-B) for the point fit and every bootstrap replicate.
Read each parameter as the report prints it: `estimate [lo, hi]`, `estimate (no interval: why)`, or
`not identified (why)` — a parameter the data cannot pin down is never printed as a number."""),
    ("code", """from scaling_rl.scaling.report import _ci as show
fit = scaling.analyze(curves, scaling.Settings(n_bootstrap=n_bootstrap, n_thresholds=3))
print("chosen law:", {t: s["chosen"] for t, s in fit["model_selection"].items()},
      "| replicates ok everywhere:", f"{fit['bootstrap']['n_ok']}/{fit['bootstrap']['n']}")
rows = []
for rec in fit["data_efficiency_sigma_n"]:
    if "params" in rec:
        rows.append({"task": rec["task"], "J": round(rec["threshold"], 3), "R² (log)": round(rec["r2_log"], 4),
                     "AICc": round(rec["aicc"], 2), **{k: show(v) for k, v in rec["params"].items()}})
pd.DataFrame(rows)"""),
    ("code", """b = fit["hparams"]["batch_size_sigma"]
print("B*(σ) slope s =", show(b["params"]["s"]))
pd.DataFrame([{k: r[k] for k in ("task", "threshold", "holdout", "mean_abs_log_error_train",
                                 "mean_abs_log_error_heldout")} for r in fit["extrapolation"]])"""),
    ("md", """## 4. Plot
The same figures `scaling-rl fit` writes; `scaling-rl plot FIT_DIR` redraws them from `fit.json`."""),
    ("code", """paths = scaling.write_outputs(fit, out_dir, figures=False)
for fn in (plots.plot_data_efficiency_sigma, plots.plot_contours):
    png = fn(fit, out_dir)[0]
    display(Image(png, width=900))"""),
    ("md", """## 5. Choose N and σ for a budget
For each threshold the budget-optimal (σ*, N*) minimises F = 10·N·B·σ·D + δ·D, searched inside the swept σ and N
(`Settings(extrapolate=K)` allows K× beyond, marked); an optimum on the edge of that box is reported as "beyond
the sweep", not as a number. Across thresholds σ*, N*, D* and C* follow power laws in F. `recommend` reads them
inside the fitted range of budgets (beyond it only with `extrapolate=True`, marked)."""),
    ("code", """al = fit["allocation"]
print(f"δ = {al['delta']:.3g} FLOPs per env step ({al['delta_source']})")
pd.DataFrame([{"J": round(r["threshold"], 3), "σ*": show(r["intervals"]["sigma"]), "N*": show(r["intervals"]["N"]),
               "on the box edge": r["edge"] or "", "D*": show(r["intervals"]["D"]), "F*": show(r["intervals"]["F"])}
              for r in al["per_threshold"]])"""),
    ("code", """F_lo, F_hi = next(p["F_range"] for p in al["power_laws"] if p["target"] == "D" and "F_range" in p)
budget = (F_lo * F_hi) ** 0.5  # inside the fitted range; beyond it is extrapolation
choice = scaling.recommend(fit, budget)
print(f"budget F = {budget:.3g} FLOPs -> σ = {choice['sigma']:.3g}, N = {choice['N']:.3g} parameters, "
      f"B = {choice['B']:.0f}, D = {choice['D']:.3g} env steps, C = {choice['C']:.3g} FLOPs "
      f"(reaches J ≈ {choice['threshold_reachable']:.2f}; extrapolated: {choice['extrapolated']})")"""),
]


def build() -> nbf.NotebookNode:
    nb = nbf.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbf.v4.new_markdown_cell(src) if kind == "md" else nbf.v4.new_code_cell(src) for kind, src in CELLS]
    return nb


NOTEBOOK = Path(__file__).with_name("walkthrough.ipynb")
VOLATILE_ENV = ("SCALING_RL_RESULTS", "SCALING_RL_BOOTSTRAP", "SCALING_RL_OUT")


@contextlib.contextmanager
def _clean_env():
    """The committed configuration: the notebook's own defaults, Agg backend, and a `python` on PATH that
    is this interpreter (the python3 kernel spec launches `python`)."""
    saved = dict(os.environ)
    for k in VOLATILE_ENV:
        os.environ.pop(k, None)
    os.environ["MPLBACKEND"] = "Agg"
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + saved.get("PATH", "")
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def execute(nb: nbf.NotebookNode, timeout: int = 120) -> nbf.NotebookNode:
    """Run every cell in a fresh kernel (in a temporary directory) and drop run-specific metadata."""
    from nbclient import NotebookClient
    with _clean_env(), tempfile.TemporaryDirectory() as tmp:
        NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                       resources={"metadata": {"path": tmp}}).execute()
    nb.metadata = {"kernelspec": nb.metadata["kernelspec"], "scaling_rl": {"machine": machine()}}
    for c in nb.cells:
        c.metadata.pop("execution", None)
    return nb


def machine() -> str:
    """The machine type the outputs were made on (CPU model and vector ISA): the printed numbers are
    bit-reproducible on the same type; across types the BLAS/XLA kernels round differently and an
    optimiser can end a few percent elsewhere (see `same_up_to_rounding`)."""
    import platform
    model, flags = "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, val = line.partition(":")
            if key.strip() == "model name" and not model:
                model = val.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(val.split())
    except OSError:
        pass
    isa = [f for f in ("avx512f", "avx2", "fma", "neon", "asimd") if f in flags]
    return " ".join([platform.machine(), model or platform.processor(), *isa]).strip()


NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def same_up_to_rounding(got: list, want: list, rtol: float = 0.25, atol: float = 1e-3) -> list[str]:
    """Differences between two `comparable` outputs that rounding on another machine type does not
    explain: any change of text, structure or output kind, or a number off by more than rtol/atol
    (measured across CPU types: a held-out extrapolation error 0.077 vs 0.087, everything else equal)."""
    import numpy as np
    problems = []
    if len(got) != len(want):
        return [f"{len(got)} code cells vs {len(want)}"]
    for i, (g, w) in enumerate(zip(got, want)):
        if [x[0] for x in g] != [x[0] for x in w] or [x[2:] for x in g if x[0] != "stdout"] != \
                [x[2:] for x in w if x[0] != "stdout"]:
            problems.append(f"code cell {i}: the outputs' kinds differ")
            continue
        for x, y in zip(g, w):
            a, b = x[1] or "", y[1] or ""
            if NUMBER.split(a) != NUMBER.split(b):
                problems.append(f"code cell {i}: the text differs beyond its numbers")
                continue
            na, nb_ = (np.array([float(t) for t in NUMBER.findall(s)]) for s in (a, b))
            bad = ~np.isclose(na, nb_, rtol=rtol, atol=atol)
            if bad.any():
                j = int(np.argmax(bad))
                problems.append(f"code cell {i}: {na[j]:g} vs {nb_[j]:g} (and {int(bad.sum()) - 1} more)")
    return problems


def comparable(nb: nbf.NotebookNode) -> list:
    """What the test compares, per code cell: stdout text and plain-text results verbatim, and the kinds of
    rich output (a PNG's bytes depend on the matplotlib/freetype build, so figures are compared by count)."""
    out = []
    for c in nb.cells:
        if c.cell_type != "code":
            continue
        items = []
        for o in c.get("outputs", []):
            if o["output_type"] == "stream":
                if o["name"] == "stdout":
                    items.append(("stdout", o["text"]))
            elif o["output_type"] == "error":
                items.append(("error", o["ename"], o["evalue"]))
            else:
                data = o.get("data", {})
                items.append((o["output_type"], data.get("text/plain"), sorted(k for k in data if k != "text/plain")))
        out.append(items)
    return out


def main() -> None:
    from scaling_rl.io import atomic_write_text
    nb = execute(build())
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o["output_type"] == "error"]
    if errors:
        sys.exit(f"error: the walkthrough raised {errors[0]['ename']}: {errors[0]['evalue']}; not written")
    atomic_write_text(NOTEBOOK, nbf.writes(nb) + "\n")
    os.chmod(NOTEBOOK, 0o644)
    print(NOTEBOOK)


if __name__ == "__main__":
    main()

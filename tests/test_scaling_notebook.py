"""analysis/walkthrough.ipynb executes end to end on a small sweep this test generates."""
import os
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from scaling_rl.scaling import synthetic

NOTEBOOK = Path(__file__).resolve().parents[1] / "analysis" / "walkthrough.ipynb"


def test_walkthrough_notebook_runs(tmp_path, monkeypatch):
    results = tmp_path / "results.parquet"
    synthetic.make_table(synthetic.Truth(), utds=[0.5, 1, 2, 4], param_counts=[1e5, 3e5, 1e6], batch_sizes=[256, 512],
                         lrs=[3e-4], seeds=3, n_log=60, rng=5, return_scale=100).to_parquet(results)
    monkeypatch.setenv("SCALING_RL_RESULTS", str(results))
    monkeypatch.setenv("SCALING_RL_BOOTSTRAP", "20")
    monkeypatch.setenv("SCALING_RL_OUT", str(tmp_path / "out"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    # The kernel spec launches `python`: make it this interpreter.
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit the notebook without outputs"
    t0 = time.perf_counter()
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    elapsed = time.perf_counter() - t0
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "budget F =" in text and "σ =" in text and "extrapolated: False" in text
    pngs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})]
    assert len(pngs) == 2
    assert (tmp_path / "out" / "fit.json").exists()
    if elapsed > 60:
        pytest.fail(f"walkthrough took {elapsed:.0f} s; keep it under 60 s")

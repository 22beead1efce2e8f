"""analysis/walkthrough.ipynb is committed executed (tables and figures visible when browsing it), and its
committed outputs are what it produces now: the test re-executes the generated notebook and compares, bit for
bit on the machine type that made them (recorded in the notebook's metadata), else text exactly and numbers
within rounding's reach (`make_walkthrough.same_up_to_rounding`).
After a change that moves any printed number, regenerate it with `make notebook`."""
import importlib.util
import time
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("make_walkthrough", ROOT / "analysis" / "make_walkthrough.py")
mw = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mw)


def test_committed_walkthrough_has_outputs_and_they_are_what_it_produces():
    committed = nbformat.read(mw.NOTEBOOK, as_version=4)
    built = mw.build()
    assert [c.source for c in committed.cells] == [c.source for c in built.cells], \
        "walkthrough.ipynb is not what analysis/make_walkthrough.py builds: run `make notebook`"
    want = mw.comparable(committed)
    assert all(want[i] for i in range(len(want))), "a code cell without output: run `make notebook`"
    t0 = time.perf_counter()
    fresh = mw.execute(built)
    elapsed = time.perf_counter() - t0
    got = mw.comparable(fresh)
    assert not any(item[0] == "error" for cell in got for item in cell), got
    text = "\n".join(item[1] or "" for cell in got for item in cell)
    assert "budget F =" in text and "σ =" in text and "extrapolated: False" in text
    assert sum(item[2] == ["image/png"] for cell in got for item in cell if item[0] == "display_data") == 2
    if committed.metadata.get("scaling_rl", {}).get("machine") == mw.machine():
        # the machine type that made the committed outputs: bit for bit
        for i, (g, w) in enumerate(zip(got, want)):
            assert g == w, f"code cell {i}: committed outputs differ from a fresh run (run `make notebook`)"
        assert len(got) == len(want)
    else:
        # another machine type rounds differently: same text, numbers within rounding's reach
        problems = mw.same_up_to_rounding(got, want)
        assert not problems, f"{problems}: committed outputs differ from a fresh run (run `make notebook`)"
    if elapsed > 60:
        pytest.fail(f"walkthrough took {elapsed:.0f} s; keep it under 60 s")

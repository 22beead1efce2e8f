"""The CI skip check of tests/conftest.py: a skip that tests/expected_skips.txt does not name, or a
listed test that runs, or a stale line, fails the session; without the env var nothing is checked."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SUITE = '''
import pytest

def test_runs():
    pass

@pytest.mark.skipif(True, reason="no gpu here")
def test_needs_gpu():
    pass

def test_skips_inside():
    pytest.skip("optional dependency missing")
'''


@pytest.fixture
def suite(tmp_path):
    d = tmp_path / "tests"
    d.mkdir()
    shutil.copy(HERE / "conftest.py", d / "conftest.py")
    (d / "test_toy.py").write_text(SUITE)
    return d


def _pytest(suite: Path, allow: str | None, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SCALING_RL_EXPECTED_SKIPS"}
    if allow is not None:
        (suite / "expected_skips.txt").write_text(allow)
        env["SCALING_RL_EXPECTED_SKIPS"] = str(suite / "expected_skips.txt")
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(suite), *args],
                          cwd=suite.parent, env=env, capture_output=True, text=True, timeout=120)


def test_only_listed_skips_pass(suite):
    both = ("tests/test_toy.py::test_needs_gpu  # no GPU in CI\n"
            "tests/test_toy.py::test_skips_*  # wildcard\n")
    ok = _pytest(suite, both)
    assert ok.returncode == 0, ok.stdout
    assert "skip check (expected_skips.txt): 2 expected, 0 problem(s)" in ok.stdout

    one = _pytest(suite, "tests/test_toy.py::test_needs_gpu\n")
    assert one.returncode == 1
    assert "unexpected skip: tests/test_toy.py::test_skips_inside" in one.stdout
    assert "optional dependency missing" in one.stdout

    stale = _pytest(suite, both + "tests/test_toy.py::test_runs\ntests/test_gone.py  # renamed\n")
    assert stale.returncode == 1
    assert "listed as skipping but ran: tests/test_toy.py::test_runs" in stale.stdout
    assert "listed but matches no test: tests/test_gone.py" in stale.stdout
    # a partial run (-k) does not call unmatched lines stale
    partial = _pytest(suite, both + "tests/test_gone.py\n", "-k", "gpu")
    assert partial.returncode == 0, partial.stdout


def test_unset_checks_nothing_and_a_bad_path_is_a_usage_error(suite):
    assert _pytest(suite, None).returncode == 0
    env = {**os.environ, "SCALING_RL_EXPECTED_SKIPS": str(suite / "missing.txt")}
    bad = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(suite)],
                         cwd=suite.parent, env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 4 and "is not a file" in bad.stdout + bad.stderr

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


SLOW_SUITE = '''
import pytest

def test_fast():
    pass

@pytest.mark.slow
def test_soak():
    pass

@pytest.mark.slow
@pytest.mark.skipif(True, reason="no gpu here")
def test_slow_needs_gpu():
    pass
'''


def test_slow_tests_run_only_in_the_slow_suite_and_the_skip_check_still_sees_them(tmp_path):
    d = tmp_path / "tests"
    d.mkdir()
    shutil.copy(HERE / "conftest.py", d / "conftest.py")
    (d / "test_toy.py").write_text(SLOW_SUITE)
    listed = "tests/test_toy.py::test_slow_needs_gpu  # no GPU in CI\n"
    fast = _pytest(d, listed)                       # `make test`: the slow ones are deselected
    assert fast.returncode == 0, fast.stdout
    assert "1 passed, 2 deselected" in fast.stdout
    assert "skip check (expected_skips.txt): 0 expected, 0 problem(s)" in fast.stdout   # not stale
    slow = _pytest(d, listed, "--suite", "slow")    # `make test-slow`
    assert slow.returncode == 0, slow.stdout
    assert "1 passed, 1 skipped, 1 deselected" in slow.stdout
    both = _pytest(d, listed, "--suite", "all")
    assert "2 passed, 1 skipped" in both.stdout and both.returncode == 0
    gone = _pytest(d, listed + "tests/test_toy.py::test_renamed\n")   # a stale line still fails
    assert gone.returncode == 1 and "listed but matches no test: tests/test_toy.py::test_renamed" in gone.stdout


def test_the_check_holds_under_xdist_workers(suite):
    """`make test` runs on two xdist workers: the controller, not each worker, judges the skips —
    an unexpected skip still fails the session, counted once, and an allowed one passes."""
    both = ("tests/test_toy.py::test_needs_gpu  # no GPU in CI\n"
            "tests/test_toy.py::test_skips_*  # wildcard\n")
    ok = _pytest(suite, both, "-n", "2")
    assert ok.returncode == 0, ok.stdout
    assert "skip check (expected_skips.txt): 2 expected, 0 problem(s)" in ok.stdout
    one = _pytest(suite, "tests/test_toy.py::test_needs_gpu\n", "-n", "2")
    assert one.returncode == 1, one.stdout
    assert one.stdout.count("unexpected skip: tests/test_toy.py::test_skips_inside") == 1
    stale = _pytest(suite, both + "tests/test_gone.py  # renamed\n", "-n", "2")
    assert stale.returncode == 1 and "listed but matches no test: tests/test_gone.py" in stale.stdout
    # a listed test that only the slow suite holds is deselected here, not stale
    (suite / "test_slow_toy.py").write_text(
        "import pytest\n\n@pytest.mark.slow\ndef test_slow_gpu():\n    pytest.skip('no gpu')\n")
    slow_only = _pytest(suite, both + "tests/test_slow_toy.py::test_slow_gpu  # slow suite only\n", "-n", "2")
    assert slow_only.returncode == 0, slow_only.stdout

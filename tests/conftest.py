"""Shared test set-up: a persistent XLA compilation cache so reruns of the suite compile less; LLVM
at -O0 for XLA:CPU (the suite's programs are tiny, so compiling them dominates its time); the
fast / slow split (`--suite`); the CI skip check; a per-test duration log."""
import os
import pathlib

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
_cache = pathlib.Path(__file__).resolve().parent.parent / ".jax_cache"
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(_cache))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
# XLA:CPU's backend (LLVM) optimisation level 0: about half the CPU time of compiling the suite's
# tiny programs at the same step time (docs/testing.md). In the environment, so the subprocesses the
# tests start inherit it (tests/forced_devices.py xla_flags); an explicit level in $XLA_FLAGS wins.
OPT_LEVEL_FLAG = "--xla_backend_optimization_level"
if OPT_LEVEL_FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {OPT_LEVEL_FLAG}=0".strip()


# --- CI: no test may vanish behind a skip ----------------------------------------------------------
# When $SCALING_RL_EXPECTED_SKIPS names an allowlist (.ci/run sets tests/expected_skips.txt), the
# session fails if a test skips that the list does not name (an `importorskip` whose dependency went
# missing hides a whole module), or a listed test runs instead of skipping (the list is stale), or,
# in a whole-suite run, a listed pattern matches no test at all. One pattern per line: a node id
# (fnmatch wildcards allowed; a module path covers a module-level skip), then `# why`. Unset (every
# dev machine, `make test` without Slurm), nothing is checked.
import fnmatch  # noqa: E402

import pytest  # noqa: E402

EXPECTED_SKIPS_ENV = "SCALING_RL_EXPECTED_SKIPS"
_skip_check: dict | None = None


def _allowlist(path: pathlib.Path) -> list[str]:
    patterns = []
    for line in path.read_text().splitlines():
        pattern = line.split("#", 1)[0].strip()
        if pattern:
            patterns.append(pattern)
    return patterns


# --- the fast / slow split ------------------------------------------------------------------------
# Tests marked `@pytest.mark.slow` (benchmark-like checks, multi-process soaks, long learning runs) are
# not part of `make test` (the default `--suite fast`); `make test-slow` runs them (`--suite slow`),
# `--suite all` runs both. Deselected tests are not skips: the CI skip check below is not affected.
SUITES = ("fast", "slow", "all")


def pytest_addoption(parser):
    parser.addoption("--suite", choices=SUITES, default="fast",
                     help="fast (default, `make test`): tests not marked slow; slow (`make test-slow`): "
                          "only those; all: both")


def pytest_collection_modifyitems(config, items):
    if _skip_check is not None:   # every collected test, before the split: stale-line check
        _skip_check["collected"] = {item.nodeid for item in items}
    elif _is_xdist_worker(config) and os.environ.get(EXPECTED_SKIPS_ENV):   # for the controller
        config.workeroutput["collected"] = [item.nodeid for item in items]
    suite = config.getoption("suite")
    if suite == "all":
        return
    keep, drop = [], []
    for item in items:
        (keep if (item.get_closest_marker("slow") is not None) == (suite == "slow") else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
    # longest files first (the order `make test`'s workers take files in, see pytest_configure): the
    # few slow files no longer start last and leave one worker alone with them (a shorter makespan)
    keep.sort(key=lambda item: _heavy_rank(item.nodeid))
    items[:] = keep


# Test files by measured wall time in `make test` (setup + calls, clean clone on 2 cores, slowest first;
# `--durations=25` and SCALING_RL_DURATIONS_LOG show them). Unlisted files follow in collection order.
HEAVY_FIRST = ("test_multiprocess_train.py", "test_gpu_run.py", "test_acco.py", "test_zero.py", "test_parallel.py",
               "test_sweep_adaptive.py", "test_llm_async_sources.py", "test_crl_brax.py", "test_packed_trials.py",
               "test_sac.py", "test_dqn.py", "test_crl.py", "test_train.py", "test_sweep_agents.py",
               "test_sweep_early_stop.py")


def _heavy_rank(nodeid: str) -> int:
    name = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    return HEAVY_FIRST.index(name) if name in HEAVY_FIRST else len(HEAVY_FIRST)


def _is_xdist_worker(config) -> bool:
    """Under pytest-xdist (`make test` runs `-n 2`) every worker's reports reach the controller's
    hooks too: only the controller (or a plain run) judges skips and logs durations."""
    return hasattr(config, "workerinput")


_worker = False


def pytest_configure(config):
    global _skip_check, _worker
    # xdist's --dist loadfile hands out files by number of tests (largest first) unless told not to;
    # take them in the collection order above, which puts the longest files first instead
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    _worker = _is_xdist_worker(config)
    name = os.environ.get(EXPECTED_SKIPS_ENV)
    if not name or _worker:
        return
    path = pathlib.Path(name)
    path = path if path.is_absolute() else pathlib.Path(config.rootpath) / path
    if not path.is_file():
        raise pytest.UsageError(f"{EXPECTED_SKIPS_ENV}: {path} is not a file; point it at the allowlist "
                                "(tests/expected_skips.txt) or unset it")
    _skip_check = {"path": path, "patterns": _allowlist(path), "skipped": {}, "ran": set(), "seen": set()}


def _matches(nodeid: str, patterns: list[str]) -> list[str]:
    return [p for p in patterns if fnmatch.fnmatchcase(nodeid, p)]


def _matches_any(nodeids, pattern: str) -> bool:
    return any(fnmatch.fnmatchcase(n, pattern) or n.startswith(pattern + "::") for n in nodeids)


def _record(report) -> None:
    if _skip_check is None:
        return
    _skip_check["seen"].update(_matches(report.nodeid, _skip_check["patterns"]))
    if report.skipped and not hasattr(report, "wasxfail"):   # an xfail is not a skip
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _skip_check["skipped"][report.nodeid] = reason
    elif getattr(report, "when", None) == "call":
        _skip_check["ran"].add(report.nodeid)


def pytest_collectreport(report):
    _record(report)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """xdist controller: a worker's collection before the fast / slow split, for the stale-line check."""
    if _skip_check is not None:
        _skip_check.setdefault("collected", set()).update(getattr(node, "workeroutput", {}).get("collected", []))


# --- per-test wall time, written as each test finishes -------------------------------------------
# $SCALING_RL_DURATIONS_LOG names a file that gets one line per test, `<seconds>\t<node id>` (setup +
# call + teardown), appended as soon as the test ends: an interrupted or timed-out run still leaves the
# ranking of what ran (`--durations` prints only at the end). `sort -rn` it for the slowest.
DURATIONS_ENV = "SCALING_RL_DURATIONS_LOG"
_durations: dict[str, float] = {}


def _log_duration(report) -> None:
    name = os.environ.get(DURATIONS_ENV)
    if not name or _worker:
        return
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration
    if report.when == "teardown":
        with open(name, "a") as f:
            f.write(f"{_durations.pop(report.nodeid):.2f}\t{report.nodeid}\n")


def pytest_runtest_logreport(report):
    _record(report)
    _log_duration(report)


def _whole_suite(config) -> bool:
    tests_dir = pathlib.Path(__file__).resolve().parent
    return (not config.option.keyword and not config.option.markexpr and not config.option.deselect
            and all(pathlib.Path(a).resolve() == tests_dir for a in config.args))


def pytest_sessionfinish(session, exitstatus):
    if _skip_check is None:
        return
    patterns = _skip_check["patterns"]
    problems = [f"unexpected skip: {nodeid} ({reason})" for nodeid, reason in
                sorted(_skip_check["skipped"].items()) if not _matches(nodeid, patterns)]
    problems += [f"listed as skipping but ran: {nodeid}" for nodeid in sorted(_skip_check["ran"])
                 if _matches(nodeid, patterns)]
    if _whole_suite(session.config):
        collected = _skip_check.get("collected", set())
        problems += [f"listed but matches no test: {p}" for p in patterns
                     if p not in _skip_check["seen"] and not _matches_any(collected, p)]
    _skip_check["problems"] = problems
    if problems and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    if _skip_check is None:
        return
    problems = _skip_check.get("problems", [])
    expected = len(_skip_check["skipped"]) - sum(p.startswith("unexpected skip") for p in problems)
    terminalreporter.write_sep("=", f"skip check ({_skip_check['path'].name}): {expected} expected, "
                                    f"{len(problems)} problem(s)", red=bool(problems), green=not problems)
    for p in problems:
        terminalreporter.write_line(p)
    if problems:
        terminalreporter.write_line(f"update {_skip_check['path']} only for a skip CI really cannot avoid")

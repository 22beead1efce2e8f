"""Issue 38's corpus: every command against corrupt or foreign run/store files, unwritable outputs,
invalid numeric flags and non-finite levels in a table. Each case must end in exactly one stderr line
`scaling-rl: error: ...`, exit code 2, and an unchanged tree (hashed before and after).

Read-only locations are a real read-only bind mount when this box allows one (root on Linux), else
`os.access` / `os.statvfs` report the folder read-only (the same preflight path); a separate test raises
EROFS in the middle of a write to exercise the CLI's last line of defence.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from scaling_rl.cli import main

SPEC = """\
name: {name}
agent: toy
out_dir: {out}
env_steps: 200
seeds: 2
compile_cache: false   # in-process trials would point JAX's global compile cache into the store
base: {{env: toy/law, chunk_env_steps: 50}}
grid: {{width: {widths}, utd: [1, 2]}}
"""
DQN = {"env": "gymnax/CartPole-v1", "width": "16", "depth": "1", "env_steps": "448", "num_envs": "4",
       "learning_starts": "64", "chunk_env_steps": "128", "batch_size": "32", "utd": "0.25",
       "buffer_size": "1024", "val_buffer_size": "256", "eval_episodes": "2"}
TRAIN = ["train", "--agent", "dqn", "--seeds", "1", "--no-progress"]
for _k, _v in DQN.items():
    TRAIN += ["--set", f"{_k}={_v}"]
QUIET_FIT = ["--bootstrap", "2", "--n-thresholds", "2", "--quiet", "--no-figures"]


def tree_hash(root: Path) -> dict:
    """Every path under `root` -> sha256 of its bytes ("dir" for a folder): equal trees compare equal."""
    return {str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir")
            for p in sorted(root.rglob("*"))}


def changes(before: dict, after: dict) -> list[str]:
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


def _try_ro_mount(src: Path, dst: Path) -> bool:
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    try:
        r = subprocess.run(["mount", "-o", "bind,ro", str(src), str(dst)], capture_output=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return False
    if r.returncode != 0:
        return False
    try:
        (dst / "probe").touch()
    except OSError as e:
        return e.errno == errno.EROFS
    (src / "probe").unlink()   # the mount did not make it read-only
    subprocess.run(["umount", str(dst)], capture_output=True, timeout=20)
    return False


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    """The scratch tree every case runs against (root `tree`) and a read-only folder `ro` beside it."""
    base = tmp_path_factory.mktemp("cli38")
    R = base / "tree"
    R.mkdir()
    (R / "spec_a.yaml").write_text(SPEC.format(name="a", out=R / "store", widths="[4, 8]"))
    (R / "spec_b.yaml").write_text(SPEC.format(name="b", out=R / "store_b", widths="[16]"))
    assert main(["sweep", "run", str(R / "spec_a.yaml"), "--workers", "0", "--no-progress"]) == 0
    store = R / "store"
    tids = sorted(p.name for p in (store / "trials").iterdir())
    assert len(tids) == 4
    for name, rel, text in [("badstatus", "trial_status.json", "{oops"), ("liststatus", "trial_status.json", "[1]"),
                            ("oddstate", "trial_status.json", '{"state": "exploded"}'),
                            ("badparquet", "metrics.parquet", "PAR1garbage"), ("badtrialjson", "trial.json", ""),
                            ("listtrialjson", "trial.json", "[]"), ("keytrialjson", "trial.json", '{"agent": "toy"}')]:
        shutil.copytree(store, R / f"store_{name}")
        (R / f"store_{name}" / "trials" / tids[1] / rel).write_text(text)
    shutil.copytree(store, R / "store_badsweepjson")
    (R / "store_badsweepjson" / "sweep.json").write_text("{")

    from scaling_rl import train
    cfg = train.make_config("dqn", DQN)
    record = json.dumps({"agent": "dqn", "config": train._config_dict(cfg), "seeds": 1, "seed": 0})
    for name, config_text, status in [("run_empty", "", None), ("run_list", "[1, 2]", None),
                                      ("run_binary", "\udcff", None),
                                      ("run_badstatus", record, "{not json"), ("run_liststatus", record, "[]"),
                                      ("run_badmetrics", record, '{"status": "done"}')]:
        d = R / name
        d.mkdir()
        (d / "config.json").write_bytes(config_text.encode("utf-8", "surrogateescape"))
        if status is not None:
            (d / "status.json").write_text(status)
            (d / "metrics.parquet").write_bytes(b"PAR1 torn")

    from scaling_rl.scaling import synthetic
    table = synthetic.make_table(synthetic.Truth(), utds=[0.5, 1, 2, 4], param_counts=[1e5, 1e6], batch_sizes=[256],
                                 lrs=[3e-4], seeds=3, n_log=30, rng=0, return_scale=100)
    table.to_parquet(R / "table.parquet")
    for name, col, val in [("nan_utd", "utd", np.nan), ("zero_n", "param_count", 0.0),
                           ("inf_n", "param_count", np.inf), ("neg_n", "param_count", -5.0)]:
        t = table.copy()
        t.loc[t["utd"] == t["utd"].iloc[0], col] = val
        t.to_parquet(R / f"table_{name}.parquet")
    assert main(["fit", str(R / "table.parquet"), "--out", str(R / "fit"), *QUIET_FIT]) == 0
    (R / "afile").write_text("x")

    src, ro = base / "ro_src", base / "ro"
    src.mkdir()
    ro.mkdir()
    mounted = _try_ro_mount(src, ro)
    yield {"R": R, "ro": ro, "mounted": mounted, "tids": tids}
    if mounted:
        subprocess.run(["umount", str(ro)], capture_output=True, timeout=20)


@pytest.fixture
def ro_mode(fx, monkeypatch):
    """Without a real read-only mount: the folder `ro` answers as a read-only file system would."""
    if fx["mounted"]:
        return "mount"
    ro = str(fx["ro"])
    real_access, real_statvfs = os.access, os.statvfs

    def access(path, mode, *a, **k):
        if str(path).startswith(ro) and mode & os.W_OK:
            return False
        return real_access(path, mode, *a, **k)

    class _RO:
        f_flag = os.ST_RDONLY

    def statvfs(path):
        return _RO() if str(path).startswith(ro) else real_statvfs(path)

    monkeypatch.setattr(os, "access", access)
    monkeypatch.setattr(os, "statvfs", statvfs)
    return "simulated"


def run_cli(argv, capsys):
    capsys.readouterr()
    try:
        rc = main(argv)
    except SystemExit as e:   # argparse
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, [line for line in err.splitlines() if line.strip()]


T = "{R}"
CASES = [
    # train: corrupt or foreign files in the run directory, outputs that cannot be written
    ("train-empty-config", [*TRAIN, "--out", f"{T}/run_empty"], "config.json: empty"),
    ("train-list-config", [*TRAIN, "--out", f"{T}/run_list"], "config.json: holds a JSON list"),
    ("train-binary-config", [*TRAIN, "--out", f"{T}/run_binary"], "config.json: not"),
    ("train-corrupt-status", [*TRAIN, "--out", f"{T}/run_badstatus"], "status.json: not valid JSON"),
    ("train-list-status", [*TRAIN, "--out", f"{T}/run_liststatus"], "status.json: holds a JSON list"),
    ("train-corrupt-metrics-of-done", [*TRAIN, "--out", f"{T}/run_badmetrics"], "metrics.parquet: not a readable"),
    ("train-out-under-file", [*TRAIN, "--out", f"{T}/afile/sub"], "which is not a directory"),
    ("train-out-ro", [*TRAIN, "--out", "{ro}/run"], "read-only file system"),
    # sweep run: foreign stores, corrupt stores, unwritable out_dir
    ("sweep-run-foreign-store", ["sweep", "run", f"{T}/spec_b.yaml", "--out", f"{T}/store", "--workers", "0",
                                 "--no-progress"], "holds sweep 'a' (agent toy), not 'b'"),
    ("sweep-run-foreign-dry-run", ["sweep", "run", f"{T}/spec_b.yaml", "--out", f"{T}/store", "--dry-run"],
     "holds sweep 'a'"),
    ("sweep-run-into-train-run", ["sweep", "run", f"{T}/spec_b.yaml", "--out", f"{T}/run_badstatus", "--workers",
                                  "0", "--no-progress"], "single `train` run"),
    ("sweep-run-corrupt-sweep-json", ["sweep", "run", f"{T}/spec_a.yaml", "--out", f"{T}/store_badsweepjson",
                                      "--workers", "0", "--no-progress"], "sweep.json: not valid JSON"),
    ("sweep-run-corrupt-status", ["sweep", "run", f"{T}/spec_a.yaml", "--out", f"{T}/store_badstatus",
                                  "--workers", "0", "--no-progress"], "trial_status.json: not valid JSON"),
    ("sweep-run-corrupt-status-forced", ["sweep", "run", f"{T}/spec_a.yaml", "--out", f"{T}/store_badstatus",
                                         "--workers", "0", "--no-progress", "--force"], "trial_status.json"),
    ("sweep-run-corrupt-trial-json", ["sweep", "run", f"{T}/spec_a.yaml", "--out", f"{T}/store_badtrialjson",
                                      "--workers", "0", "--no-progress"], "trial.json: empty"),
    ("sweep-run-ro", ["sweep", "run", f"{T}/spec_a.yaml", "--out", "{ro}/s", "--workers", "0", "--no-progress"],
     "read-only file system"),
    ("sweep-run-bad-workers", ["sweep", "run", f"{T}/spec_a.yaml", "--workers", "-1"], "--workers"),
    # sweep status: one bad trial is named (the others are listed, see below)
    ("sweep-status-corrupt-status", ["sweep", "status", f"{T}/store_badstatus"], "1 trial(s) unreadable"),
    ("sweep-status-trials-corrupt", ["sweep", "status", f"{T}/store_badstatus", "--trials"], "not valid JSON"),
    ("sweep-status-trials-list-status", ["sweep", "status", f"{T}/store_liststatus", "--trials"], "JSON list"),
    ("sweep-status-trials-odd-state", ["sweep", "status", f"{T}/store_oddstate", "--trials"], "unknown state"),
    ("sweep-status-trials-bad-trial", ["sweep", "status", f"{T}/store_badtrialjson", "--trials"], "trial.json"),
    ("sweep-status-trials-list-trial", ["sweep", "status", f"{T}/store_listtrialjson", "--trials"], "trial.json"),
    ("sweep-status-trials-keyless-trial", ["sweep", "status", f"{T}/store_keytrialjson", "--trials"],
     "not a trial record"),
    ("sweep-status-json-corrupt", ["sweep", "status", f"{T}/store_badstatus", "--json"], "unreadable"),
    ("sweep-status-not-a-store", ["sweep", "status", f"{T}/fit"], "not a sweep directory"),
    # sweep collect: a corrupt trial is named and nothing is written; the store's own files are not outputs
    ("sweep-collect-corrupt-parquet", ["sweep", "collect", f"{T}/store_badparquet", "--no-progress"],
     "metrics.parquet: not a readable parquet table"),
    ("sweep-collect-corrupt-trial", ["sweep", "collect", f"{T}/store_badtrialjson", "--no-progress"], "trial.json"),
    ("sweep-collect-corrupt-status", ["sweep", "collect", f"{T}/store_badstatus", "--no-progress"],
     "trial_status.json"),
    ("sweep-collect-out-sweep-json", ["sweep", "collect", f"{T}/store", "--out", f"{T}/store/sweep.json",
                                      "--no-progress"], "give a .parquet path"),
    ("sweep-collect-out-in-trials", ["sweep", "collect", f"{T}/store", "--out", f"{T}/store/trials/x.parquet",
                                     "--no-progress"], "a file of the sweep store"),
    ("sweep-collect-out-dir", ["sweep", "collect", f"{T}/store", "--out", f"{T}/fit", "--no-progress"], ".parquet"),
    ("sweep-collect-out-is-dir", ["sweep", "collect", f"{T}/store", "--out", f"{T}/store_b.parquet",
                                  "--no-progress"], "is a directory"),
    ("sweep-collect-out-under-file", ["sweep", "collect", f"{T}/store", "--out", f"{T}/afile/r.parquet",
                                      "--no-progress"], "not a directory"),
    ("sweep-collect-ro", ["sweep", "collect", f"{T}/store", "--out", "{ro}/r.parquet", "--no-progress"],
     "read-only file system"),
    # fit: invalid numbers, non-finite levels in the table, outputs that cannot be written
    ("fit-huber-negative", ["fit", f"{T}/table.parquet", "--out", f"{T}/f2", "--loss", "huber", "--huber-delta",
                            "-1", *QUIET_FIT], "--huber-delta"),
    ("fit-huber-inf", ["fit", f"{T}/table.parquet", "--out", f"{T}/f2", "--huber-delta", "inf", *QUIET_FIT],
     "--huber-delta"),
    ("fit-threshold-above-1", ["fit", f"{T}/table.parquet", "--out", f"{T}/f2", "--thresholds", "1.5", *QUIET_FIT],
     "--thresholds: 1.5 must be in (0, 1]"),
    ("fit-threshold-zero", ["fit", f"{T}/table.parquet", "--out", f"{T}/f2", "--thresholds", "0.5,0", *QUIET_FIT],
     "--thresholds: 0"),
    ("fit-threshold-nan", ["fit", f"{T}/table.parquet", "--out", f"{T}/f2", "--thresholds", "nan", *QUIET_FIT],
     "--thresholds: nan"),
    ("fit-threshold-inf-raw", ["fit", f"{T}/table.parquet", "--out", f"{T}/f2", "--normalize", "none",
                               "--thresholds", "inf", *QUIET_FIT], "must be finite"),
    ("fit-n-thresholds-0", ["fit", f"{T}/table.parquet", "--out", f"{T}/f2", *QUIET_FIT, "--n-thresholds", "0"],
     "n_thresholds"),
    ("fit-delta-nan", ["fit", f"{T}/table.parquet", "--out", f"{T}/f2", "--delta", "nan", *QUIET_FIT], "delta"),
    ("fit-level-nan", ["fit", f"{T}/table.parquet", "--out", f"{T}/f2", "--level", "nan", *QUIET_FIT], "level"),
    ("fit-extrapolate-nan", ["fit", f"{T}/table.parquet", "--out", f"{T}/f2", "--extrapolate", "nan", *QUIET_FIT],
     "--extrapolate"),
    ("fit-param-count-negative", ["fit", f"{T}/table.parquet", "--out", f"{T}/f2", "--param-count", "-1",
                                  *QUIET_FIT], "param_count"),
    ("fit-param-count-inf", ["fit", f"{T}/table.parquet", "--out", f"{T}/f2", "--param-count", "inf", *QUIET_FIT],
     "param_count"),
    ("fit-table-nan-utd", ["fit", f"{T}/table_nan_utd.parquet", "--out", f"{T}/f2", *QUIET_FIT], "(utd)"),
    ("fit-table-zero-n", ["fit", f"{T}/table_zero_n.parquet", "--out", f"{T}/f2", *QUIET_FIT], "(param_count)"),
    ("fit-table-inf-n", ["fit", f"{T}/table_inf_n.parquet", "--out", f"{T}/f2", *QUIET_FIT], "(param_count)"),
    ("fit-table-negative-n", ["fit", f"{T}/table_neg_n.parquet", "--out", f"{T}/f2", *QUIET_FIT], "(param_count)"),
    ("fit-corrupt-table", ["fit", f"{T}/store_badparquet/trials/{{tid1}}/metrics.parquet", "--out", f"{T}/f2",
                           *QUIET_FIT], None),
    ("fit-out-ro", ["fit", f"{T}/table.parquet", "--out", "{ro}/f", *QUIET_FIT], "read-only file system"),
    ("fit-out-under-file", ["fit", f"{T}/table.parquet", "--out", f"{T}/afile/f", *QUIET_FIT], "not a directory"),
    ("fit-out-is-file", ["fit", f"{T}/table.parquet", "--out", f"{T}/afile", *QUIET_FIT], "not a directory"),
    # plot
    ("plot-out-ro", ["plot", f"{T}/fit", "--out", "{ro}/p"], "read-only file system"),
    ("plot-out-is-file", ["plot", f"{T}/fit", "--out", f"{T}/afile"], "not a directory"),
    ("plot-out-under-file", ["plot", f"{T}/fit", "--out", f"{T}/afile/p"], "not a directory"),
    ("plot-no-fit", ["plot", f"{T}/store"], "fit.json not found"),
    ("plot-corrupt-fit", ["plot", f"{T}/run_badstatus/status.json"], None),
    # grpo / dpo / passk: foreign or unwritable run directories (refused before torch is imported)
    ("grpo-out-is-file", ["grpo", "--out", f"{T}/afile", "steps=1"], "not a directory"),
    ("grpo-out-under-file", ["grpo", "--out", f"{T}/afile/g", "steps=1"], "not a directory"),
    ("grpo-out-train-run", ["grpo", "--out", f"{T}/run_badstatus", "steps=1"], "holds config.json"),
    ("grpo-out-sweep-store", ["grpo", "--out", f"{T}/store", "steps=1"], "holds sweep.json"),
    ("grpo-out-ro", ["grpo", "--out", "{ro}/g", "steps=1"], "read-only file system"),
    ("grpo-config-not-mapping", ["grpo", "--out", f"{T}/g", "--config", f"{T}/run_list/config.json"],
     "expected a mapping"),
    ("dpo-out-is-file", ["dpo", "--out", f"{T}/afile", "steps=1"], "not a directory"),
    ("dpo-out-train-run", ["dpo", "--out", f"{T}/run_empty", "steps=1"], "holds config.json"),
    ("dpo-out-ro", ["dpo", "--out", "{ro}/d", "steps=1"], "read-only file system"),
    ("passk-out-ro", ["passk", "--model", f"{T}/fit", "--out", "{ro}/p.csv"], "read-only file system"),
    ("passk-out-is-dir", ["passk", "--model", f"{T}/fit", "--out", f"{T}/store_b.csv"], "is a directory"),
]


@pytest.mark.parametrize("argv, needle", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_changes_nothing(fx, ro_mode, capsys, argv, needle):
    R = fx["R"]
    (R / "store_b.parquet").mkdir(exist_ok=True)   # directories named like output files
    (R / "store_b.csv").mkdir(exist_ok=True)
    argv = [a.replace("{R}", str(R)).replace("{ro}", str(fx["ro"])).replace("{tid1}", fx["tids"][1]) for a in argv]
    before = {**tree_hash(R), **({f"ro/{k}": v for k, v in tree_hash(fx["ro"]).items()} if fx["mounted"] else {})}
    rc, out, err = run_cli(argv, capsys)
    assert (rc, len(err)) == (2, 1), (rc, err)
    assert err[0].startswith("scaling-rl: error: ") or err[0].startswith("scaling-rl "), err
    assert "Traceback" not in err[0]
    if needle is not None:
        assert needle in err[0], err[0]
    if argv[:2] != ["sweep", "status"]:
        assert out == "", out
    after = {**tree_hash(R), **({f"ro/{k}": v for k, v in tree_hash(fx["ro"]).items()} if fx["mounted"] else {})}
    assert not changes(before, after), f"the tree changed: {changes(before, after)[:5]}"


def test_status_lists_the_readable_trials_beside_the_bad_one(fx, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")   # rich would cut the cells of a narrow captured terminal
    rc, out, err = run_cli(["sweep", "status", str(fx["R"] / "store_badstatus"), "--trials"], capsys)
    assert rc == 2 and len(err) == 1 and fx["tids"][1] in err[0]
    rows = {t: line for line in out.splitlines() for t in fx["tids"] if t in line}
    assert set(rows) == set(fx["tids"])
    assert "unreadable" in rows[fx["tids"][1]]
    assert all("done" in rows[t] for t in fx["tids"] if t != fx["tids"][1])
    rc, out, _ = run_cli(["sweep", "status", str(fx["R"] / "store_badstatus"), "--json"], capsys)
    s = json.loads(out)
    assert s["counts"]["done"] == 3 and s["counts"]["unreadable"] == 1 and s["total"] == 4
    assert [tid for tid, _ in s["unreadable"]] == [fx["tids"][1]]


def test_a_store_keeps_its_spec_and_force_adds_to_it(fx, capsys, tmp_path):
    """Same spec again: no refusal (done trials skipped). A foreign spec with --force: its trials are
    added and sweep.json names the new spec; the resolved name is recorded for an unnamed spec too."""
    R = fx["R"]
    store = tmp_path / "store"
    shutil.copytree(R / "store", store)
    rc, _, err = run_cli(["sweep", "run", str(R / "spec_a.yaml"), "--out", str(store), "--workers", "0",
                          "--no-progress"], capsys)
    assert rc == 0 and err == []
    assert len(list((store / "trials").iterdir())) == 4
    assert json.loads((store / "sweep.json").read_text())["spec"]["name"] == "a"
    rc, _, err = run_cli(["sweep", "run", str(R / "spec_b.yaml"), "--out", str(store), "--workers", "0",
                          "--no-progress", "--force"], capsys)
    assert rc == 0, err
    assert len(list((store / "trials").iterdir())) == 6
    assert json.loads((store / "sweep.json").read_text())["spec"]["name"] == "b"
    unnamed = tmp_path / "unnamed.yaml"
    unnamed.write_text("\n".join(line for line in (R / "spec_a.yaml").read_text().splitlines()
                                 if not line.startswith("name:")).replace(str(R / "store"), str(tmp_path / "u")))
    assert run_cli(["sweep", "run", str(unnamed), "--workers", "0", "--no-progress"], capsys)[0] == 0
    assert json.loads((tmp_path / "u" / "sweep.json").read_text())["spec"]["name"] == "unnamed"


def test_collect_of_a_sound_store_still_writes(fx, capsys, tmp_path):
    rc, out, err = run_cli(["sweep", "collect", str(fx["R"] / "store"), "--out", str(tmp_path / "r.parquet"),
                            "--no-progress"], capsys)
    assert rc == 0 and err == []
    df = pd.read_parquet(tmp_path / "r.parquet")
    assert df["trial_id"].nunique() == 4 and len(df) == 4 * 2 * 4   # trials × seeds × chunks


def test_a_write_that_fails_midway_is_one_line(fx, capsys, monkeypatch, tmp_path):
    """The preflight passed, then the file system refuses (EROFS while creating the temporary file):
    one line naming the path, exit 2, nothing left behind."""
    import tempfile

    def refuse(*a, **k):
        raise OSError(errno.EROFS, "Read-only file system", str(k.get("dir", a[-1] if a else "")))

    out = tmp_path / "o"
    out.mkdir()
    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    rc, stdout, err = run_cli(["sweep", "collect", str(fx["R"] / "store"), "--out", str(out / "r.parquet"),
                               "--no-progress"], capsys)
    assert rc == 2 and err == [f"scaling-rl: error: {out}: Read-only file system"], err
    assert list(out.iterdir()) == []
    monkeypatch.setenv("SCALING_RL_TRACEBACK", "1")   # developers can still see where
    with pytest.raises(OSError):
        main(["sweep", "collect", str(fx["R"] / "store"), "--out", str(out / "r.parquet"), "--no-progress"])


def test_library_readers_raise_one_line_corrupt_file(fx):
    from scaling_rl.errors import CorruptFile, UsageError
    from scaling_rl.sweep.store import Store

    store = Store(fx["R"] / "store_badstatus")
    with pytest.raises(CorruptFile) as e:
        store.status(fx["tids"][1])
    assert isinstance(e.value, ValueError) and isinstance(e.value, UsageError)
    assert "\n" not in str(e.value) and str(e.value).startswith(str(store.trial_dir(fx["tids"][1])))
    assert store.status(fx["tids"][0])["state"] == "done"
    assert store.counts()["unreadable"] == 1 and store.counts()["done"] == 3
    with contextlib.suppress(FileNotFoundError):
        (fx["R"] / "nowhere").rmdir()
    assert Store(fx["R"] / "nowhere").foreign("a", "toy") is None

"""Malformed sweep specs a new user writes: each is refused by `scaling-rl sweep run` (and --dry-run)
with exit 2, one line naming the problem, and nothing written. No training; JAX only traces shapes
in the lower-bound test."""
from __future__ import annotations

import dataclasses
import math
import os
import textwrap
from pathlib import Path

import pytest
import yaml

from scaling_rl import cli
from scaling_rl.sweep import SpecError, load_spec, memory, spec as spec_mod

REPO = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, text: str, name: str = "spec.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def snapshot(root: Path) -> dict:
    """Every path under root with its bytes (files) or None (dirs)."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*"))}


def refused(capsys, argv: list[str], message: str) -> str:
    """`scaling-rl <argv>` exits 2 with exactly one stderr line containing `message`."""
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith("scaling-rl: error:") and "\n" not in err, err
    assert "Traceback" not in captured.err + captured.out
    assert message in err, err
    return err


@pytest.fixture(autouse=True)
def _no_budget_override(monkeypatch):
    monkeypatch.delenv(memory.BUDGET_ENV, raising=False)


# ---- out_dir naming a file --------------------------------------------------------------------
@pytest.mark.parametrize("dry_run", [False, True])
def test_out_dir_that_is_a_file_is_refused_and_untouched(tmp_path, capsys, dry_run):
    afile = tmp_path / "results.csv"
    afile.write_text("a,b\n1,2\n")
    spec = write(tmp_path, f"agent: toy\nout_dir: {afile}\ngrid: {{width: [4, 8]}}\n")
    before = snapshot(tmp_path)
    refused(capsys, ["sweep", "run", str(spec), "--no-progress", *(["--dry-run"] if dry_run else [])],
            f"out_dir: {afile} is a file, not a directory")
    assert snapshot(tmp_path) == before


def test_out_dir_under_a_file_and_out_flag_are_refused(tmp_path, capsys):
    afile = tmp_path / "notes.txt"
    afile.write_text("x")
    spec = write(tmp_path, f"agent: toy\nout_dir: {afile}/store\ngrid: {{width: [4]}}\n")
    before = snapshot(tmp_path)
    refused(capsys, ["sweep", "run", str(spec), "--no-progress"],
            f"out_dir: {afile}/store lies under {afile}, which is a file, not a directory")
    # --out overrides the spec's out_dir and is checked the same way
    good = write(tmp_path, f"agent: toy\nout_dir: {tmp_path / 'fine'}\ngrid: {{width: [4]}}\n", "good.yaml")
    before = snapshot(tmp_path)
    refused(capsys, ["sweep", "run", str(good), "--out", str(afile), "--no-progress"], "is a file")
    assert snapshot(tmp_path) == before
    # compile_cache: a directory too
    cache = write(tmp_path, f"agent: toy\nout_dir: {tmp_path / 's'}\ncompile_cache: {afile}\n"
                            "grid: {width: [4]}\n", "cache.yaml")
    with pytest.raises(SpecError, match=r"^compile_cache: .* is a file, not a directory"):
        load_spec(cache)
    assert not (tmp_path / "s").exists()


# ---- duplicated YAML keys ---------------------------------------------------------------------
def test_duplicated_top_level_key_is_refused_with_its_line(tmp_path, capsys):
    out = tmp_path / "store"
    spec = write(tmp_path, f"""\
        agent: toy
        out_dir: {out}
        grid: {{width: [4, 8]}}
        seeds: 2
        grid: {{width: [16]}}
    """)
    for extra in ([], ["--dry-run"]):
        refused(capsys, ["sweep", "run", str(spec), "--no-progress", *extra],
                f"{spec}: line 5: duplicate key 'grid' (first on line 3); give each key once")
    assert not out.exists()


def test_duplicated_nested_key_is_refused(tmp_path, capsys):
    out = tmp_path / "store"
    spec = write(tmp_path, f"""\
        agent: toy
        out_dir: {out}
        base:
          width: 4
          lr: 1.0e-3
          width: 8
        grid: {{utd: [1, 2]}}
    """)
    refused(capsys, ["sweep", "run", str(spec), "--no-progress"], "line 6: duplicate key 'width' (first on line 4)")
    flow = write(tmp_path, f"agent: toy\nout_dir: {out}\ngrid: {{utd: [1], utd: [2]}}\n", "flow.yaml")
    refused(capsys, ["sweep", "run", str(flow), "--no-progress"], "line 3: duplicate key 'utd' (first on line 3)")
    assert not out.exists()


def test_unique_key_check_keeps_safe_load_semantics():
    text = textwrap.dedent("""\
        a: &anchor {k: 1, j: 2.5e-3, when: 2024-01-02, yes: true, none: null}
        b:
          <<: *anchor
          k: 3            # a merged key may be overridden: that is YAML, not a duplicate
        c: [1, 1, {x: 1}]
        1: int key
        "1": str key
    """)
    assert spec_mod.safe_load_unique(text) == yaml.safe_load(text)
    assert spec_mod.safe_load_unique(text)["b"]["k"] == 3
    with pytest.raises(yaml.YAMLError):  # tags stay refused
        spec_mod.safe_load_unique("a: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(spec_mod.DuplicateKeyError):  # 1 and 1.0 are the same dict key
        spec_mod.safe_load_unique("1: a\n1.0: b\n")
    with pytest.raises(spec_mod.DuplicateKeyError):  # nested in a sequence too
        spec_mod.safe_load_unique("a: [{x: 1, x: 2}]\n")


# ---- memory ----------------------------------------------------------------------------------
SAC = """\
agent: sac
out_dir: {out}
seeds: {seeds}
base: {{env: gymnax/Pendulum-v1, depth: 1{base}}}
{axes}
"""


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_trial_too_big_for_the_machine_is_refused_naming_the_field(tmp_path, capsys, dry_run):
    out = tmp_path / "store"
    spec = write(tmp_path, SAC.format(out=out, seeds=5, base="", axes="grid: {width: [64, 100000000]}"))
    err = refused(capsys, ["sweep", "run", str(spec), "--no-progress", *(["--dry-run"] if dry_run else [])],
                  "grid.width: a trial with width=100000000 needs ~")
    assert "PiB" in err or "EiB" in err
    assert "(params + optimiser + gradients + replay), more than this machine's" in err
    assert "GiB" in err.split("more than")[1] and err.endswith("lower width")
    assert not out.exists()


def test_memory_refusal_names_where_the_field_is_set(tmp_path, capsys, monkeypatch):
    out = tmp_path / "store"
    zipped = write(tmp_path, SAC.format(out=out, seeds=1, base="",
                                        axes="zip: {width: [64, 100000000], utd: [1, 2]}"), "zip.yaml")
    refused(capsys, ["sweep", "run", str(zipped)], "zip.width: a trial with width=100000000 needs")
    # replay: buffer_size in base, under a budget from $SCALING_RL_MEMORY_BUDGET
    monkeypatch.setenv(memory.BUDGET_ENV, "1GiB")
    big_buffer = write(tmp_path, SAC.format(out=out, seeds=1, base=", buffer_size: 100000000",
                                            axes="grid: {width: [8, 16]}"), "buf.yaml")
    refused(capsys, ["sweep", "run", str(big_buffer)],
            f"base.buffer_size: a trial with buffer_size=100000000 needs ~1.86 GiB for 1 seed(s) "
            f"(params + optimiser + gradients + replay), more than ${memory.BUDGET_ENV}=1GiB; lower buffer_size")
    # every field fits one seed, but not the seeds of one trial (vmapped together)
    monkeypatch.setenv(memory.BUDGET_ENV, "64MiB")
    seeds = write(tmp_path, SAC.format(out=out, seeds=20, base=", buffer_size: 1000000",
                                       axes="grid: {width: [8]}"), "seeds.yaml")
    refused(capsys, ["sweep", "run", str(seeds)], "seeds: a trial of 20 seeds needs ~")
    monkeypatch.setenv(memory.BUDGET_ENV, "lots")
    refused(capsys, ["sweep", "run", str(seeds)], f"{memory.BUDGET_ENV}: cannot read 'lots' as a size")
    assert not out.exists()


def test_memory_budget_follows_the_backend(tmp_path, capsys, monkeypatch):
    out = tmp_path / "store"
    text = SAC.format(out=out, seeds=1, base=", width: 4096", axes="grid: {depth: [1, 256]}")
    plain = write(tmp_path, text)
    spec = load_spec(plain)          # ~450 GiB at depth 256: too big for a 24 GiB host, not for a node
    monkeypatch.setattr(memory, "host_memory", lambda: 24 * 2 ** 30)
    monkeypatch.setattr(memory, "_jax_will_use_gpu", lambda: False)
    with pytest.raises(SpecError, match=r"^grid\.depth: a trial with depth=256 needs ~.* more than this "
                                        r"machine's 24 GiB; lower depth$"):
        memory.check_spec(spec)
    memory.check_spec(spec, "ray")   # runs elsewhere: only the any-node ceiling applies
    with_mem = write(tmp_path, text + "backend: {slurm: {mem_gb: 32}}\n", "slurm.yaml")
    refused(capsys, ["sweep", "run", str(with_mem), "--backend", "slurm", "--no-wait"],
            "more than backend.slurm.mem_gb (32 GiB)")
    # a GPU: its memory, read without starting a JAX client in the runner
    monkeypatch.setattr(memory, "_jax_will_use_gpu", lambda: True)
    monkeypatch.setattr(memory, "_gpu_memory", lambda: (80 * 2 ** 30, "NVIDIA H100 80GB HBM3"))
    refused(capsys, ["sweep", "run", str(plain)], "more than this machine's GPU (NVIDIA H100 80GB HBM3, 80 GiB)")
    assert not out.exists()


def test_gpu_detection_honours_jax_platforms(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert memory._jax_will_use_gpu() is False
    monkeypatch.setenv("JAX_PLATFORMS", "cuda,cpu")
    assert memory._jax_will_use_gpu() is True


def test_shipped_specs_fit(monkeypatch):
    monkeypatch.setattr(memory, "host_memory", lambda: 16 * 2 ** 30)   # a small laptop
    monkeypatch.setattr(memory, "_jax_will_use_gpu", lambda: False)
    for path in sorted((REPO / "sweeps").glob("*.yaml")):
        try:
            spec = load_spec(path)
        except SpecError as e:
            if "is not available here" in str(e):
                continue
            raise
        for backend in ("local", "slurm", "ray"):
            memory.check_spec(spec, backend)


def _state_bytes(agent_mod, cfg) -> int:
    import jax
    agent = agent_mod.make(cfg)
    shapes = jax.eval_shape(agent.init, jax.random.PRNGKey(0))
    return sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(shapes))


@pytest.mark.parametrize("agent, kw", [
    ("sac", dict(env="gymnax/Pendulum-v1", width=256, depth=2, buffer_size=20_000)),
    ("dqn", dict(env="gymnax/CartPole-v1", width=256, depth=2, buffer_size=20_000)),
    ("crl", dict(width=128, depth=8, buffer_size=16_384)),
])
def test_estimate_is_a_lower_bound_of_the_real_state(agent, kw):
    """Without the gradients (not part of the state), the estimate never exceeds the bytes of the
    agent's initial training state (shapes only; nothing runs) and is most of it."""
    from scaling_rl import agents
    mod = agents.get(agent)
    cfg = mod.Config(**kw)
    est = memory.trial_bytes(agent, dataclasses.asdict(cfg))
    real = _state_bytes(mod, cfg)
    state_part = est["params"] + est["optimiser"] + est["replay"]
    assert 0.6 * real <= state_part <= real, (est, real)
    assert memory.trial_bytes(agent, dataclasses.asdict(cfg), seeds=3)["params"] == 3 * est["params"]
    assert memory.trial_bytes("toy", {"width": 10 ** 12}) is None   # kinds without an estimate


def test_format_bytes():
    assert memory.format_bytes(512) == "512 B"
    assert memory.format_bytes(24 * 2 ** 30) == "24 GiB"
    assert memory.format_bytes(8e16) == "71.1 PiB"
    assert memory.format_bytes(2 ** 70) == "1.02e+03 EiB"


# ---- backend.workers --------------------------------------------------------------------------
def test_workers_zero_runs_inline_and_negative_is_refused(tmp_path, capsys):
    """workers: 0 is not "automatic": it runs every trial inside the `sweep run` process (the spec
    docs say so); a negative count is refused."""
    assert 'is not "automatic"' in spec_mod.__doc__
    out = tmp_path / "store"
    spec = write(tmp_path, f"agent: toy\nout_dir: {out}\nenv_steps: 200\ngrid: {{width: [4, 8]}}\n"
                           "backend: {workers: 0}\n")
    assert load_spec(spec).backend["workers"] == 0
    assert cli.main(["sweep", "run", str(spec), "--no-progress"]) == 0
    logs = list(out.glob("trials/*/executions.log"))
    pids = {line.split()[0] for log in logs for line in log.read_text().splitlines()}
    assert len(logs) == 2 and pids == {str(os.getpid())}   # ran here, no worker pool
    capsys.readouterr()
    neg_out = tmp_path / "neg"
    neg = write(tmp_path, f"agent: toy\nout_dir: {neg_out}\ngrid: {{width: [4]}}\nbackend: {{workers: -1}}\n", "neg.yaml")
    refused(capsys, ["sweep", "run", str(neg)], "backend.workers: expected an integer >= 0, got -1")
    refused(capsys, ["sweep", "run", str(spec), "--workers", "-2"], "--workers: must be >= 0, got -2")
    assert not neg_out.exists()


def test_axes_given_as_ranges_with_a_resolution(tmp_path):
    from scaling_rl.sweep import parse_spec
    spec = parse_spec({"agent": "toy", "out_dir": str(tmp_path / "o"),
                       "grid": {"utd": {"range": [0.5, 8], "num": 5}, "width": {"range": [64, 1024], "num": 5}},
                       "zip": {"lr": {"range": [1e-4, 3e-4], "num": 3, "log": False}, "batch_size": [32, 64, 128]}})
    assert len(spec.trials) == 75
    assert sorted({t.config["utd"] for t in spec.trials}) == [0.5, 1.0, 2.0, 4.0, 8.0]
    assert sorted({t.config["width"] for t in spec.trials}) == [64, 128, 256, 512, 1024]
    assert sorted({t.config["lr"] for t in spec.trials}) == [1e-4, 2e-4, 3e-4]
    assert {t.axes["width"] for t in spec.trials} == {64, 128, 256, 512, 1024}


@pytest.mark.parametrize("axis, message", [
    ({"range": [8, 0.5], "num": 5}, "grid.utd.range: expected [lo, hi] with lo < hi"),
    ({"range": [0, 8], "num": 5}, "a log range needs lo > 0"),
    ({"range": [0.5, 8], "num": 1}, "grid.utd.num: expected an integer >= 2"),
    ({"range": [0.5, 8], "num": 3, "step": 2}, "grid.utd.step: unknown key"),
    ({"range": [0.5, 8], "num": 3, "log": "yes"}, "grid.utd.log: expected true or false"),
])
def test_bad_range_axes_are_one_line_errors(tmp_path, axis, message):
    from scaling_rl.sweep import SpecError, parse_spec
    with pytest.raises(SpecError) as e:
        parse_spec({"agent": "toy", "out_dir": str(tmp_path / "o"), "grid": {"utd": axis}})
    assert message in str(e.value) and "\n" not in str(e.value)

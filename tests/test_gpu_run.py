"""The prepared GPU call (benchmarks/gpu/run.sh) run here the way the device machine runs it.

scripts/gpu_emulate.py gives run.sh an interpreter that sees only the device image's packages
(benchmarks/gpu/image_packages.txt: no brax, gymnax, mujoco, wandb; no editable scaling_rl), a copy
of the repository as it travels, and checks $OUT the way the transfer back does. The dry run here
covers sections a (backbone MFU), b (scanned vs unrolled CRL update: both children finish and print
their ratio; the plain scanned child runs on the GPU only, its arguments are the flagged child's), c (CRL launch -> first chunk; imports the agent, the env and the replay without
brax/gymnax) and d (packed trials: a ratio per pack size, printed as it goes);
`python scripts/gpu_emulate.py` runs all seven (minutes: every CRL program compiles).
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


emulate = _load("gpu_emulate", ROOT / "scripts" / "gpu_emulate.py")


def test_image_packages_hold_the_gpu_runs_needs_and_not_the_cpu_extras():
    pkgs = emulate.image_packages()
    assert pkgs["jax"] == "0.11.2" and pkgs["torch"] == "2.11.0" and pkgs["huggingface-hub"] == "1.33.0"
    for need in ("flax", "optax", "chex", "orbax-checkpoint", "scipy", "pandas", "pyarrow", "pyyaml",
                 "matplotlib", "rich", "tqdm", "scikit-learn", "flatbuffers", "transformers", "pip"):
        assert need in pkgs, need
    for absent in ("brax", "gymnax", "mujoco", "wandb", "ray", "submitit", "scaling-rl"):
        assert absent not in pkgs, absent


def test_out_check_applies_the_transfer_back_rules(tmp_path):
    assert emulate.check_out(tmp_path) == ["nothing written under $OUT"]
    for i in range(8):
        (tmp_path / f"f{i}.txt").write_text("x")
    assert emulate.check_out(tmp_path) == []
    (tmp_path / "f8.txt").write_text("x")
    (tmp_path / "a b.txt").write_text("x")
    deep = tmp_path / "a" / "b" / "c"
    deep.mkdir(parents=True)
    (deep / "g.txt").write_text("x")
    problems = emulate.check_out(tmp_path)
    assert any("11 files" in p for p in problems)
    assert any(p.startswith("a b.txt: name") for p in problems)
    assert any("more than two folders down" in p for p in problems)


def test_without_a_gpu_the_run_stops_at_once_with_one_line(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "run.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, env={"JAX_PLATFORMS": "cpu",
                                                                             "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "not 'gpu'" in proc.stderr
    assert not list(tmp_path.iterdir())
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "run.py"), "--sections", "az"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "use letters of abcdefg" in bad.stderr


def test_emulated_dry_run_on_the_image_packages(tmp_path):
    python = ROOT / ".venv" / "bin" / "python"
    python = str(python if python.exists() else sys.executable)
    work, wheels = tmp_path / "emu", tmp_path / "whl"
    wheels.mkdir()
    _tiny_wheel(wheels / "gpu_probe-0.1-py3-none-any.whl")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_emulate.py"), "--python", python,
                           "--keep", str(work), "--wheels", str(wheels), "--timeout", "800", "--", "--dry", "--sections", "a,b,c,d"],
                          capture_output=True, text=True, timeout=850)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    assert "gpu_emulate ok" in proc.stdout.splitlines()[-1]
    out = work / "out"
    assert sorted(p.name for p in out.iterdir()) == ["log.txt", "results.json", "results.md"]
    record = json.loads((out / "results.json").read_text())
    assert record["dry"] is True and set(record["sections"]) == {"a", "b", "c", "d"}
    assert all(s["status"] == "ok" for s in record["sections"].values()), record
    md = (out / "results.md").read_text()
    assert "| 4 | 16 | 16 |" in md                                   # section a's table row
    assert "launch -> first chunk" in md and "env-steps/s" in md      # section c's result
    # section b: the side-by-side comparison finishes (a finite ratio), then the scanned stack alone,
    # plainly and with while loops in command buffers (the flag parses: XLA aborts on an unknown one)
    b_lines = record["sections"]["b"]["lines"]
    ratios = [float(ln.split("=", 1)[1]) for ln in b_lines if ln.startswith("min_speedup_vs_unrolled=")]
    assert len(ratios) == 2 and ratios[0] > 0 and "stopped after" not in "\n".join(b_lines)
    assert any(ln.startswith("dry: not run") for ln in b_lines)   # the plain scanned child: GPU only
    # section d: one row and one ratio per pack size; one trial is its own baseline
    d = {ln.split("=")[0]: float(ln.split("=")[1]) for ln in record["sections"]["d"]["lines"]
         if ln.startswith("packed_ratio_")}
    assert set(d) == {"packed_ratio_1", "packed_ratio_2"} and d["packed_ratio_1"] == 1.0
    assert all(v > 0 for v in d.values())
    # brax/gymnax/wandb are not importable there, and the run did not need them
    image_py = work / "image" / "bin" / "python"
    probe = subprocess.run([str(image_py), "-c", "import importlib.util as u; "
                            "print([m for m in ('brax', 'gymnax', 'wandb', 'scaling_rl', 'jax', 'flax') "
                            "if u.find_spec(m)])"], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert probe.stdout.strip() == "['jax', 'flax']", probe.stdout + probe.stderr
    # the carried wheel went in with the device README's pip line, into the site run.sh put on PYTHONPATH
    assert (work / "site" / "gpu_probe.py").read_text() == "VALUE = 42\n"
    assert "1 carried wheel(s)" in proc.stdout


def _tiny_wheel(path: Path) -> None:
    """A minimal pure-Python wheel (module gpu_probe) to carry the way the device call carries one."""
    import zipfile

    meta = "gpu_probe-0.1.dist-info"
    files = {"gpu_probe.py": "VALUE = 42\n",
             f"{meta}/METADATA": "Metadata-Version: 2.1\nName: gpu_probe\nVersion: 0.1\n",
             f"{meta}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{name},,\n" for name in files) + f"{meta}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in {**files, f"{meta}/RECORD": record}.items():
            z.writestr(name, text)

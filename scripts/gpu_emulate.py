"""Run the GPU entry point here, on CPU, the way the lent device machine would run it.

What the device machine does with one `run` call (/work/.library/device/README.md): it copies the
repository's tracked and untracked-not-ignored files plus the `carry` paths (64 MiB in all), runs the
command in the repository root with the image's `python3` (its packages: benchmarks/gpu/image_packages.txt;
no `.venv`, no editable install of scaling_rl), and brings back at most 8 files from `$OUT`
(16 MiB each, two folders down, names of letters, digits, '.', '_' and '-').

This script builds that situation here and runs `bash benchmarks/gpu/run.sh --dry` in it:

  * an interpreter that sees ONLY the image's packages: a `venv --without-pip` of the project venv's
    base Python whose site-packages holds links to the files of just those distributions of the project
    venv whose names are in image_packages.txt (versions as installed here; each one that differs from
    the pinned one is printed). `--exact DIR` instead pip-installs the pinned versions (CPU builds) into
    DIR once and reuses it (needs PyPI and a Python 3.12; minutes, not for CI);
  * a copy of the repository as it would travel (`git ls-files -co --exclude-standard` + the carried
    `.whl/`), with its size checked against the 64 MiB limit;
  * `python3` first on PATH, `$OUT` an empty folder, no PYTHONPATH/VIRTUAL_ENV from here;
  * afterwards the same checks the transfer back applies to `$OUT`.

    .venv/bin/python scripts/gpu_emulate.py             # dry run, tiny sizes (what tests/test_gpu_run.py runs)
    .venv/bin/python scripts/gpu_emulate.py --keep /tmp/emu -- --dry --sections a,b

Exit status 0 only when the run exits 0 and `$OUT` would come back whole. Last line:
`gpu_emulate ok seconds=<wall of the run> files=<n>`.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGE = ROOT / "benchmarks" / "gpu" / "image_packages.txt"
CARRY_LIMIT = 64 * 2 ** 20
OUT_FILES, OUT_FILE_BYTES, OUT_TOTAL = 8, 16 * 2 ** 20, 64 * 2 ** 20
NAME_OK = re.compile(r"^[A-Za-z0-9._-]+$")


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def image_packages(path: Path = IMAGE) -> dict[str, str | None]:
    """{normalised name: pinned version or None} from image_packages.txt."""
    out: dict[str, str | None] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, version = line.partition("==")
        out[norm(name)] = version or None
    return out


_LISTING = r"""
import importlib.metadata as m, json, sys
rows = []
for d in m.distributions():
    files = [str(f) for f in (d.files or [])]
    reqs = [r for r in (d.requires or []) if "extra ==" not in r and "extra==" not in r]
    rows.append([d.metadata["Name"], d.version, str(d.locate_file("")), files, reqs])
json.dump(rows, sys.stdout)
"""


def filtered_interpreter(python: str, dest: Path, allowed: dict[str, str | None]) -> tuple[Path, list[str]]:
    """A venv at `dest` whose site-packages links only the `allowed` distributions of `python`'s
    environment. Returns (its python, lines naming version differences and missing packages)."""
    import json

    base = subprocess.run([python, "-c", "import sys; print(sys._base_executable)"],
                          capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run([base, "-m", "venv", "--without-pip", str(dest)], check=True)
    site = Path(subprocess.run([str(dest / "bin" / "python"), "-c",
                                "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    rows = json.loads(subprocess.run([python, "-c", _LISTING], capture_output=True, text=True,
                                     check=True).stdout)
    by_name = {}
    for row in rows:
        by_name.setdefault(norm(row[0]), row)

    def link(row) -> None:
        location, files = row[2], row[3]
        for top in {f.split("/", 1)[0] for f in files if not f.startswith("..")}:
            src, dst = Path(location) / top, site / top
            if src.exists() and not dst.exists() and not top.endswith(".pth") and top != "__editable__":
                dst.symlink_to(src)

    notes, seen = [], set()
    for key, row in by_name.items():
        if key not in allowed:
            continue
        seen.add(key)
        if allowed[key] and allowed[key] != row[1]:
            notes.append(f"{row[0]}: {row[1]} here, {allowed[key]} on the device image")
        link(row)
    # a version installed here may need a package the image's version does not (huggingface_hub 2.x
    # needs httpx2; the image's 1.33 needs httpx): link such requirements too, and say so
    todo = sorted(seen)
    while todo:
        key = todo.pop()
        for req in by_name[key][4]:
            dep = norm(re.split(r"[\s;<>=!~\[(]", req.strip(), maxsplit=1)[0])
            if dep and dep not in allowed and dep in by_name and dep not in seen:
                seen.add(dep)
                todo.append(dep)
                link(by_name[dep])
                notes.append(f"{by_name[dep][0]} {by_name[dep][1]}: not on the image, linked because "
                             f"{by_name[key][0]} {by_name[key][1]} here requires it")
    missing = sorted(k for k in allowed if k not in seen)
    notes.append(f"{len(seen)} image packages linked; not installed here (so not importable in the "
                 f"emulation either): {len(missing)}")
    return dest / "bin" / "python", notes


def exact_interpreter(dest: Path, allowed: dict[str, str | None]) -> Path:
    """A venv at `dest` with the pinned versions of the packages the GPU run imports (CPU builds)."""
    py = dest / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(dest)], check=True)
        pins = [f"{n}=={v}" for n, v in allowed.items()
                if v and not n.startswith(("jax-cuda", "cupy", "triton", "nvidia"))]
        names = [n for n, v in allowed.items() if not v and n in
                 {"flax", "optax", "orbax-checkpoint", "chex", "scipy", "pandas", "pyarrow", "matplotlib",
                  "rich", "tqdm", "pyyaml", "scikit-learn", "flatbuffers", "six", "pytest"}]
        subprocess.run([str(py), "-m", "pip", "install", "-q", "--extra-index-url",
                        "https://download.pytorch.org/whl/cpu", *pins, *names], check=True)
    return py


def travelling_files(root: Path) -> list[str]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root,
                         capture_output=True, text=True, check=True).stdout
    return [f for f in out.split("\0") if f and (root / f).is_file()]


def copy_tree(root: Path, dest: Path, carry: list[str]) -> int:
    """Copy the repository as it travels to `dest`; returns its bytes (checked against 64 MiB)."""
    total = 0
    files = travelling_files(root)
    for c in carry:
        p = root / c
        if p.is_dir():
            files += [str(f.relative_to(root)) for f in p.rglob("*") if f.is_file()]
        elif p.is_file():
            files.append(c)
    for f in files:
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / f, dest / f)
        total += (root / f).stat().st_size
    return total


def check_out(out: Path) -> list[str]:
    """What the transfer back would refuse or drop from `$OUT` (empty = it all comes back)."""
    problems, files, total = [], [], 0
    for p in sorted(out.rglob("*")):
        rel = p.relative_to(out)
        if any(not NAME_OK.match(part) for part in rel.parts):
            problems.append(f"{rel}: name has characters other than letters, digits, '.', '_', '-'")
        if p.is_symlink() or (not p.is_file() and not p.is_dir()):
            problems.append(f"{rel}: not a plain file")
        elif p.is_file():
            if len(rel.parts) > 3:
                problems.append(f"{rel}: more than two folders down")
            size = p.stat().st_size
            files.append(rel)
            total += size
            if size > OUT_FILE_BYTES:
                problems.append(f"{rel}: {size} bytes > 16 MiB")
    if len(files) > OUT_FILES:
        problems.append(f"{len(files)} files under $OUT > {OUT_FILES}")
    if total > OUT_TOTAL:
        problems.append(f"{total} bytes under $OUT > 64 MiB")
    if not files:
        problems.append("nothing written under $OUT")
    return problems


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--python", default=str(ROOT / ".venv" / "bin" / "python"),
                   help="interpreter whose packages are filtered to the image's (default: the project venv)")
    p.add_argument("--exact", metavar="DIR", help="use (build once) a venv of the pinned versions at DIR")
    p.add_argument("--wheels", metavar="DIR", default=str(ROOT / ".whl"),
                   help="wheels to carry as the repository's .whl/ (default: ./.whl, as the device call carries it)")
    p.add_argument("--keep", metavar="DIR", help="work in DIR and keep it (default: a temporary folder)")
    p.add_argument("--timeout", type=float, default=1500, help="seconds for the whole run (the device allows 600 for the real one)")
    p.add_argument("run_args", nargs="*", default=None, help="arguments of run.sh (default: --dry)")
    args = p.parse_args(argv)
    run_args = args.run_args or ["--dry"]

    work = Path(args.keep or tempfile.mkdtemp(prefix="gpu_emulate_"))
    if work.exists() and any(work.iterdir()):
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    try:
        allowed = image_packages()
        if args.exact:
            py = exact_interpreter(Path(args.exact), allowed)
            notes = [f"exact pinned venv {args.exact}"]
        else:
            if not Path(args.python).exists():
                print(f"gpu_emulate: no interpreter at {args.python}; run `make setup` or pass --python",
                      file=sys.stderr)
                return 2
            py, notes = filtered_interpreter(args.python, work / "image", allowed)
        for n in notes:
            print(f"gpu_emulate: {n}", flush=True)
        repo, out, binp = work / "repo", work / "out", py.parent   # the venv's bin: python3 resolves there
        for d in (repo, out):
            d.mkdir()
        size = copy_tree(ROOT, repo, [])
        wheels = sorted(Path(args.wheels).glob("*.whl")) if Path(args.wheels).is_dir() else []
        if wheels:
            (repo / ".whl").mkdir(exist_ok=True)
            for w in wheels:
                shutil.copy2(w, repo / ".whl" / w.name)
                size += w.stat().st_size
        print(f"gpu_emulate: {len(wheels)} carried wheel(s)", flush=True)
        print(f"gpu_emulate: working tree that travels: {size / 2 ** 20:.1f} MiB (limit 64)", flush=True)
        if size > CARRY_LIMIT:
            print(f"gpu_emulate: the working tree ({size} bytes) is over the 64 MiB limit", file=sys.stderr)
            return 1
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "JAX_PLATFORMS", "OUT")}
        env.update(PATH=f"{binp}:{env.get('PATH', '/usr/bin:/bin')}", OUT=str(out),
                   GPU_RUN_SITE=str(work / "site"))
        t0 = time.perf_counter()
        try:
            rc = subprocess.run(["bash", "benchmarks/gpu/run.sh", *run_args], cwd=repo, env=env,
                                timeout=args.timeout).returncode
        except subprocess.TimeoutExpired:
            print(f"gpu_emulate: run.sh ran past {args.timeout:.0f} s", file=sys.stderr)
            return 1
        secs = time.perf_counter() - t0
        problems = check_out(out)
        for pr in problems:
            print(f"gpu_emulate: $OUT: {pr}", file=sys.stderr)
        if rc != 0 or problems:
            print(f"gpu_emulate: FAILED rc={rc} problems={len(problems)}", file=sys.stderr)
            return 1
        n = sum(1 for f in out.rglob("*") if f.is_file())
        print(f"gpu_emulate ok seconds={secs:.1f} files={n}", flush=True)
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

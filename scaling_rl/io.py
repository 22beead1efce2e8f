"""Atomic file writes: a reader never sees a torn file, a crash never leaves half a file."""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success fsync it and rename it over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write `obj` as indented, key-sorted JSON to `path` atomically."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def atomic_write_parquet(path: str | os.PathLike, df) -> None:
    """Write a pandas DataFrame to parquet atomically."""
    with atomic_path(path) as tmp:
        df.to_parquet(tmp, index=False)


def atomic_savefig(fig, path: str | os.PathLike, *, fmt: str | None = None, **kwargs) -> None:
    """Save a matplotlib figure to `path` atomically (format from the suffix unless `fmt`)."""
    fmt = fmt or Path(path).suffix.lstrip(".") or "png"
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=fmt, **kwargs)


# ---- reading back what we wrote, and checking where we will write (before any work) ---------------
def read_json_object(path: str | os.PathLike, *, what: str = "a JSON object") -> dict:
    """The JSON object in `path`; `CorruptFile` (one line naming the file) when it is empty, not valid
    JSON, or not an object. FileNotFoundError passes through (absence is the caller's business)."""
    from scaling_rl.errors import CorruptFile

    path = Path(path)
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise CorruptFile(path, f"not text (expected {what})") from None
    except IsADirectoryError:
        raise CorruptFile(path, f"is a directory (expected a file holding {what})") from None
    if not text.strip():
        raise CorruptFile(path, f"empty (expected {what})")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise CorruptFile(path, f"not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    if not isinstance(obj, dict):
        raise CorruptFile(path, f"holds a JSON {type(obj).__name__}, expected {what}")
    return obj


def _nearest_existing(path: Path) -> Path:
    p = path
    while not os.path.lexists(p) and p.parent != p:
        p = p.parent
    return p


def _why_not_writable(d: Path) -> str | None:
    """None when files can be created in directory `d`, else why not (read-only file system, permission)."""
    if os.access(d, os.W_OK | os.X_OK):
        return None
    try:
        if os.statvfs(d).f_flag & os.ST_RDONLY:
            return "read-only file system"
    except OSError:
        pass
    return "permission denied"


def output_dir_problem(path: str | os.PathLike) -> str | None:
    """Why `path` cannot be used as an output directory (created if absent), or None. Writes nothing:
    it is, or lies under, a file; or the directory (or its nearest existing ancestor) is not writable."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        return f"{path} exists and is not a directory"
    base = _nearest_existing(path)
    if not base.is_dir():
        return f"{path} lies under {base}, which is not a directory"
    why = _why_not_writable(base)
    if why is not None:
        return f"{path} cannot be written ({why}{'' if base == path else f' at {base}'})"
    return None


def output_file_problem(path: str | os.PathLike) -> str | None:
    """Why `path` cannot be (atomically re)written as a file, or None. Writes nothing."""
    path = Path(path)
    if path.is_dir():
        return f"{path} is a directory, not a file"
    problem = output_dir_problem(path.parent)
    return None if problem is None else f"cannot write {path}: {problem}"

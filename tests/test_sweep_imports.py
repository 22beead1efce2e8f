"""The sweep package has no import circle (lazy imports inside functions count too), and each of its
modules imports on its own in a fresh interpreter."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SWEEP = Path(__file__).resolve().parents[1] / "scaling_rl" / "sweep"
PKG = "scaling_rl.sweep"


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(SWEEP.glob("*.py")):
        out[PKG if p.stem == "__init__" else f"{PKG}.{p.stem}"] = p
    return out


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the package modules it imports anywhere in its body (top level or inside a function).
    `from scaling_rl.sweep import x` is an edge to the submodule x when x is one, else to the package.
    Imports under `if typing.TYPE_CHECKING:` never run and are not edges."""
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        tree = ast.parse(p.read_text())
        typing_only = {id(n) for t in ast.walk(tree) if isinstance(t, ast.If) and "TYPE_CHECKING" in ast.dump(t.test)
                       for b in t.body for n in ast.walk(b)}
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                edges[m] |= {a.name for a in node.names if a.name in mods}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in mods:
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    edges[m].add(sub if sub in mods else node.module)
    for m in edges:
        edges[m].discard(m)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_circle():
    # the detector itself: the old spec <-> adaptive / early_stop circle, and the package loop
    old = {"spec": {"adaptive", "early_stop"}, "adaptive": {"spec", "pkg"}, "early_stop": {"spec"},
           "pkg": {"spec"}, "trial": set()}
    assert cycles(old) == [["adaptive", "early_stop", "pkg", "spec"]]
    assert cycles({"spec": {"adaptive", "trial"}, "adaptive": {"trial"}, "trial": set()}) == []


def test_sweep_package_has_no_import_circle():
    edges = import_graph(_modules())
    # the edges that used to close the circle are gone, the validation edges stay one-way
    assert f"{PKG}.adaptive" in edges[f"{PKG}.spec"] and f"{PKG}.early_stop" in edges[f"{PKG}.spec"]
    for m in ("adaptive", "early_stop", "store", "memory", "packing", "trial"):
        assert f"{PKG}.spec" not in edges[f"{PKG}.{m}"], m
        assert PKG not in edges[f"{PKG}.{m}"], m
    assert edges[f"{PKG}.trial"] == set()
    assert cycles(edges) == []


@pytest.mark.parametrize("module", ["trial", "spec", "early_stop", "adaptive", "run"])
def test_module_imports_alone_in_a_fresh_interpreter(module):
    code = (f"import importlib, sys; m = importlib.import_module('{PKG}.{module}'); "
            f"import {PKG}.spec as s; assert s.parse_spec and s.SpecError is sys.modules['{PKG}.trial'].SpecError")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]

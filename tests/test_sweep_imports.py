"""The sweep package has no import circle (lazy imports inside functions count too), and each of its
modules imports on its own in a fresh interpreter."""
from __future__ import annotations

import subprocess
import sys

import pytest
from import_graph import cycles, import_graph

PKG = "scaling_rl.sweep"


def sweep_edges() -> dict[str, set[str]]:
    """The sweep modules' edges to each other (the package-wide graph, restricted)."""
    graph = import_graph()
    return {m: {d for d in deps if d == PKG or d.startswith(PKG + ".")}
            for m, deps in graph.items() if m == PKG or m.startswith(PKG + ".")}


def test_cycle_finder_finds_a_circle():
    # the detector itself: the old spec <-> adaptive / early_stop circle, and the package loop
    old = {"spec": {"adaptive", "early_stop"}, "adaptive": {"spec", "pkg"}, "early_stop": {"spec"},
           "pkg": {"spec"}, "trial": set()}
    assert cycles(old) == [["adaptive", "early_stop", "pkg", "spec"]]
    assert cycles({"spec": {"adaptive", "trial"}, "adaptive": {"trial"}, "trial": set()}) == []


def test_sweep_package_has_no_import_circle():
    edges = sweep_edges()
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

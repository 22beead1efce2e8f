"""The sweep package has no import circle (lazy imports inside functions count, and so do type-only
imports under `if TYPE_CHECKING:`), and each of its modules imports on its own in a fresh interpreter."""
from __future__ import annotations

import subprocess
import sys

import pytest
from import_graph import cycles, import_graph

PKG = "scaling_rl.sweep"


def sweep_edges(*, type_checking: bool = False) -> dict[str, set[str]]:
    """The sweep modules' edges to each other (the package-wide graph, restricted)."""
    graph = import_graph(type_checking=type_checking)
    return {m: {d for d in deps if d == PKG or d.startswith(PKG + ".")}
            for m, deps in graph.items() if m == PKG or m.startswith(PKG + ".")}


def test_cycle_finder_finds_a_circle():
    # the detector itself: the old spec <-> adaptive / early_stop circle, and the package loop
    old = {"spec": {"adaptive", "early_stop"}, "adaptive": {"spec", "pkg"}, "early_stop": {"spec"},
           "pkg": {"spec"}, "trial": set()}
    assert cycles(old) == [["adaptive", "early_stop", "pkg", "spec"]]
    assert cycles({"spec": {"adaptive", "trial"}, "adaptive": {"trial"}, "trial": set()}) == []
    # the circle that went last: adaptive -> run -> spec (type-only) -> adaptive
    assert cycles({"adaptive": {"run"}, "run": {"spec"}, "spec": {"adaptive"}}) == [["adaptive", "run", "spec"]]


def test_type_only_imports_are_edges_only_when_asked():
    assert f"{PKG}.spec" not in sweep_edges()[f"{PKG}.run"]
    assert f"{PKG}.spec" in sweep_edges(type_checking=True)[f"{PKG}.run"]   # `Spec` in run's signatures


@pytest.mark.parametrize("type_checking", [False, True])
def test_sweep_package_has_no_import_circle(type_checking):
    edges = sweep_edges(type_checking=type_checking)
    # the spec validates its early_stop and adaptive blocks one way: through early_stop and design,
    # never through the adaptive study (which runs trials, hence imports run -> spec)
    assert {f"{PKG}.design", f"{PKG}.early_stop"} <= edges[f"{PKG}.spec"]
    assert f"{PKG}.adaptive" not in edges[f"{PKG}.spec"]
    assert {f"{PKG}.design", f"{PKG}.run"} <= edges[f"{PKG}.adaptive"]
    for m in ("adaptive", "design", "early_stop", "store", "memory", "packing", "trial"):
        assert f"{PKG}.spec" not in edges[f"{PKG}.{m}"], m
        assert PKG not in edges[f"{PKG}.{m}"], m
    assert not edges[f"{PKG}.design"] & {f"{PKG}.adaptive", f"{PKG}.run", f"{PKG}.runner"}
    assert edges[f"{PKG}.trial"] == set()
    assert cycles(edges) == []


def test_adaptive_reexports_the_design_parser():
    from scaling_rl.sweep import adaptive, design
    assert adaptive.from_spec is adaptive.parse_design is design.parse_design
    assert adaptive.Design is design.Design and adaptive.cells_of is design.cells_of


@pytest.mark.parametrize("module", ["trial", "spec", "early_stop", "design", "adaptive", "run"])
def test_module_imports_alone_in_a_fresh_interpreter(module):
    code = (f"import importlib, sys; m = importlib.import_module('{PKG}.{module}'); "
            f"import {PKG}.spec as s; assert s.parse_spec and s.SpecError is sys.modules['{PKG}.trial'].SpecError")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]

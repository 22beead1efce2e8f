"""Figures of an adaptive study (`sweep.adaptive_plots`) from hand-built state.json dicts (the layout
`sweep.adaptive.run_adaptive` writes): what is drawn is checked through the artists' gids, not just that
a file appeared."""
import json
import math

import matplotlib.image as mpimg
import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.colors import to_rgba

from scaling_rl.sweep import adaptive_plots as ap

SIGMAS = [0.5, 1.0, 2.0, 4.0, 8.0]
NS = [99856.0, 300304.0, 1000000.0, 2999824.0]
TOL = 0.05
SQ, NQ = "toy/law:sigma*(F) exponent", "toy/law:N*(F) exponent"
PNG = b"\x89PNG\r\n\x1a\n"


def _prop(task, s, n, rep=0, **extra):
    return {"task": task, "sigma": s, "N": n, "replicate": rep, "candidates": [f"{task}-{s}-{n}"],
            "trials": [f"{task}-{s}-{n}-r{rep}"], **extra}


def _w(width, est=0.1):
    if width is None:
        return {"estimate": None, "lo": None, "hi": None, "width": None, "reason": "optimum on the box edge"}
    return {"estimate": est, "lo": est - width / 2, "hi": est + width / 2, "width": width, "reason": None}


def _fit(flops, ws, wn, trials):
    return {"widths": {SQ: _w(ws), NQ: _w(wn)}, "trials": trials, "env_steps": flops / 2e9, "flops": flops,
            "stopped_early": 0}


def make_state(last_fitted=True):
    """grid3 initial design (9 cells), then two adaptive rounds with replicates of one cell; round 1 has no
    N*(F) interval; the last round is still running unless `last_fitted`."""
    init = [_prop("toy/law", s, n) for s in (0.5, 2.0, 8.0) for n in (NS[0], NS[2], NS[3])]
    r1 = [_prop("toy/law", 1.0, NS[1], score=1e-17, variance_reduction=0.5, predicted_cost=5e16),
          _prop("toy/law", 8.0, NS[0], 1, score=5e-18, variance_reduction=0.3, predicted_cost=7e16),
          _prop("toy/law", 8.0, NS[0], 2, score=2e-18, variance_reduction=None, predicted_cost=7e16)]
    r2 = [_prop("toy/law", 8.0, NS[0], 3, score=1e-18, variance_reduction=0.1, predicted_cost=7e16),
          _prop("toy/law", 4.0, NS[1], score=1e-18, variance_reduction=0.1, predicted_cost=6e16)]
    rounds = [{"round": 0, "criterion": "initial design (grid3)", "proposals": init,
               "fit": _fit(2.0e18, 0.23, 0.21, 9), "decision": "continue"},
              {"round": 1, "criterion": "frontier exponents", "proposals": r1,
               "fit": _fit(2.3e18, 0.06, None, 12), "decision": "continue"},
              {"round": 2, "criterion": "frontier exponents", "proposals": r2}]
    if last_fitted:
        rounds[2].update(fit=_fit(2.5e18, 0.04, 0.07, 14), decision="stop: max_rounds")
    return {"schema": "scaling_rl.adaptive/1", "delta": 3.5e8, "design": {"tolerance": TOL, "target": "frontier"},
            "rounds": rounds}


CANDIDATES = [("toy/law", s, n) for s in SIGMAS for n in NS]


@pytest.fixture(autouse=True)
def _no_leaks():
    plt.close("all")
    yield
    assert plt.get_fignums() == [], "a plotting function left a figure open"


def _by_gid(fig, prefix):
    return [a for ax in fig.axes for a in ax.get_children()
            if isinstance(a.get_gid(), str) and a.get_gid().startswith(prefix)]


def _png_ok(path, min_bytes=8000):
    data = path.read_bytes()
    assert data[:8] == PNG and len(data) > min_bytes, (path, len(data))
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 300
    assert float(np.std(img[..., :3])) > 0.02   # not a blank canvas


def test_write_figures_reads_state_json(tmp_path):
    state = make_state()
    (tmp_path / "adaptive").mkdir()
    (tmp_path / "adaptive" / "state.json").write_text(json.dumps(state))
    paths = ap.write_figures(tmp_path, candidates=CANDIDATES)
    assert paths == [tmp_path / "adaptive" / "rounds.png", tmp_path / "adaptive" / "widths.png"]
    for p in paths:
        _png_ok(p)
    assert not [p for p in (tmp_path / "adaptive").iterdir() if p.name.endswith(".tmp")]   # atomic: no leftovers


def test_rounds_one_marker_per_proposal_coloured_by_round(tmp_path):
    state = make_state()
    n_props = sum(len(r["proposals"]) for r in state["rounds"])
    fig = ap.plot_rounds(state, tmp_path / "r.png", candidates=CANDIDATES, return_fig=True)
    try:
        assert (tmp_path / "r.png").stat().st_size > 8000
        rounds = {a.get_gid(): a for a in _by_gid(fig, "round ")}
        assert sorted(rounds) == ["round 0", "round 1", "round 2"]
        assert {g: len(a.get_offsets()) for g, a in rounds.items()} == {"round 0": 9, "round 1": 3, "round 2": 2}
        assert sum(len(a.get_offsets()) for a in rounds.values()) == n_props
        colours = {tuple(np.round(a.get_facecolor()[0], 4)) for a in rounds.values()}
        assert len(colours) == 3
        # the four proposals of cell (σ=8, N=NS[0]) are fanned out (none hidden) and counted
        xy = np.concatenate([a.get_offsets() for a in rounds.values()])
        assert len({(round(x, 6), round(y, 3)) for x, y in xy}) == n_props
        near = [(x, y) for x, y in xy if abs(math.log(x / 8.0)) < 0.3 and abs(math.log(y / NS[0])) < 0.3]
        assert len(near) == 4
        assert [t.get_text() for t in _by_gid(fig, "count")] == ["×4"]
        # unexplored candidates: the grid minus the 11 proposed cells
        (cand,) = _by_gid(fig, "candidates")
        assert len(cand.get_offsets()) == len(CANDIDATES) - 11
        title = fig._suptitle.get_text()
        assert "14 trials" in title and "3 rounds" in title
        ax = fig.axes[0]
        assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
        legend = [t.get_text() for t in fig.legends[0].get_texts()]
        assert legend[:3] == ["round 0", "round 1", "round 2"] and "unexplored candidate" in legend
    finally:
        plt.close(fig)


def test_rounds_many_rounds_use_a_discrete_colorbar(tmp_path):
    rounds = [{"round": r, "criterion": "x", "proposals": [_prop("a", SIGMAS[r % 5], NS[r % 4], r // 20)]}
              for r in range(13)]
    fig = ap.plot_rounds({"rounds": rounds}, tmp_path / "r.png", return_fig=True)
    try:
        markers = _by_gid(fig, "round ")
        assert len(markers) == 13
        assert len({tuple(np.round(a.get_facecolor()[0], 4)) for a in markers}) == 13
        assert len(fig.axes) == 2 and fig.axes[1].get_ylabel() == "round"   # the panel and the colorbar
        assert not fig.legends
    finally:
        plt.close(fig)


def test_rounds_two_tasks_and_bad_values(tmp_path):
    state = make_state()
    state["rounds"][0]["proposals"] += [_prop("other", 1.0, 5e4), _prop("other", None, 5e4),
                                        _prop("other", float("nan"), 1e5), _prop("other", 2.0, -1)]
    fig = ap.plot_rounds(state, tmp_path / "r.png", return_fig=True)
    try:
        titles = sorted(ax.get_title() for ax in fig.axes)
        assert titles == ["other: 1 trial in 1 cell", "toy/law: 14 trials in 11 cells"]
        assert sum(len(a.get_offsets()) for a in _by_gid(fig, "round ")) == 15
        assert "3 proposals without σ/N not drawn" in fig._suptitle.get_text()
    finally:
        plt.close(fig)


def test_widths_lines_tolerance_and_no_interval(tmp_path):
    fig = ap.plot_widths(make_state(), tmp_path / "w.png", return_fig=True)
    try:
        ax = fig.axes[0]
        assert ax.get_xscale() == "log"
        (ls,) = _by_gid(fig, f"width {SQ}")
        (ln,) = _by_gid(fig, f"width {NQ}")
        assert list(ls.get_xdata()) == [2.0e18, 2.3e18, 2.5e18] and list(ls.get_ydata()) == [0.23, 0.06, 0.04]
        assert list(ln.get_xdata()) == [2.0e18, 2.5e18]   # round 1 has no N*(F) interval
        (none,) = [a for a in _by_gid(fig, "no-interval") if a.get_gid() == "no-interval"]
        assert len(none.get_offsets()) == 1
        x, y = none.get_offsets()[0]
        assert x == pytest.approx(2.3e18) and y == pytest.approx(ap.TOP)   # top edge (axes units)
        assert none.get_edgecolor()[0][:3] == pytest.approx(to_rgba(ln.get_color())[:3])
        assert [t.get_text() for t in _by_gid(fig, "no-interval-label")] == ["no interval"]
        (tol,) = _by_gid(fig, "tolerance")
        assert list(tol.get_ydata()) == [TOL, TOL]
        assert max(ax.get_ylim()) > 0.23 and min(ax.get_ylim()) < 0.04
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert "tolerance 0.05" in legend and "no interval (top edge)" in legend
        assert "toy/law: σ*(F) exponent" in legend
        assert [t.get_text() for t in _by_gid(fig, "round-label")] == ["r0", "r1", "r2"]
        assert "stop: max_rounds" in ax.get_title()
    finally:
        plt.close(fig)


def test_widths_all_infinite_and_explicit_tolerance(tmp_path):
    state = make_state()
    for rnd in state["rounds"]:
        rnd["fit"]["widths"] = {SQ: _w(None), NQ: {"width": float("inf")}}
    fig = ap.plot_widths(state, tmp_path / "w.png", tolerance=0.1, return_fig=True)
    try:
        assert not _by_gid(fig, "width ")
        assert sum(len(a.get_offsets()) for a in _by_gid(fig, "no-interval") if a.get_gid() == "no-interval") == 6
        (tol,) = _by_gid(fig, "tolerance")
        assert tol.get_ydata()[0] == 0.1
    finally:
        plt.close(fig)


def test_one_round_without_fit(tmp_path):
    state = make_state()
    state["rounds"] = state["rounds"][:1]
    del state["rounds"][0]["fit"], state["rounds"][0]["decision"]
    paths = ap.write_figures(tmp_path, state=state)
    for p in paths:
        assert p.read_bytes()[:8] == PNG
    fig = ap.plot_widths(state, tmp_path / "w.png", return_fig=True)
    try:
        assert [t.get_text() for t in _by_gid(fig, "empty")] == ["no fitted round yet"]
    finally:
        plt.close(fig)
    fig = ap.plot_rounds(state, tmp_path / "r.png", return_fig=True)
    try:
        assert [len(a.get_offsets()) for a in _by_gid(fig, "round ")] == [9]
        assert "9 trials over 1 round" in fig._suptitle.get_text()
    finally:
        plt.close(fig)


@pytest.mark.parametrize("state", [None, {}, {"rounds": []}, {"rounds": [{"round": 0, "proposals": []}]}])
def test_empty_states_never_raise(tmp_path, state):
    paths = ap.write_figures(tmp_path, state=state)   # None: no state.json on disk either
    assert [p.name for p in paths] == ["rounds.png", "widths.png"]
    assert all(p.read_bytes()[:8] == PNG for p in paths)


def test_comparison_designs_and_missing_widths(tmp_path):
    rows = [{"design": "full grid", "flops": 8e18, "widths": {"sigma": 0.03, "N": 0.05}},
            {"design": "full grid", "flops": 8.4e18, "widths": {"sigma": 0.035, "N": None}},
            {"design": "grid + early stopping", "flops": 4e18, "widths": {"sigma": float("nan"), "N": 0.06}},
            {"design": "adaptive + early stopping", "flops": 2.7e18, "widths": {"sigma": 0.031, "N": 0.07}},
            {"design": "adaptive + early stopping", "flops": 2.9e18, "widths": {"sigma": 0.04, "N": 0.045}},
            {"design": "adaptive + early stopping", "flops": None, "widths": {"sigma": 0.04, "N": 0.045}}]
    fig = ap.plot_comparison(rows, tmp_path / "c.png", tolerance=TOL, return_fig=True)
    try:
        _png_ok(tmp_path / "c.png")
        sig_ax, n_ax = fig.axes
        assert sig_ax.get_title() == "σ*(F) exponent" and n_ax.get_title() == "N*(F) exponent"

        def counts(ax):
            return {a.get_gid(): len(a.get_offsets()) for a in ax.get_children()
                    if str(a.get_gid()).startswith("design ")}
        assert counts(sig_ax) == {"design full grid": 2, "design adaptive + early stopping": 2}
        assert counts(n_ax) == {"design full grid": 1, "design grid + early stopping": 1,
                                "design adaptive + early stopping": 2}
        nones = {ax: sum(len(a.get_offsets()) for a in ax.get_children() if a.get_gid() == "no-interval")
                 for ax in (sig_ax, n_ax)}
        assert nones == {sig_ax: 1, n_ax: 1}
        cols = {a.get_gid(): tuple(np.round(a.get_facecolor()[0], 4)) for a in n_ax.get_children()
                if str(a.get_gid()).startswith("design ")}
        assert len(set(cols.values())) == 3
        assert all(ax.get_xscale() == "log" for ax in (sig_ax, n_ax))
        assert len([a for a in sig_ax.get_children() if a.get_gid() == "tolerance"]) == 1
        legend = [t.get_text() for t in fig.legends[0].get_texts()]
        assert "adaptive + early stopping (n=2)" in legend and "tolerance 0.05" in legend
    finally:
        plt.close(fig)


def test_comparison_empty_rows(tmp_path):
    assert ap.plot_comparison([], tmp_path / "c.png") == tmp_path / "c.png"
    assert (tmp_path / "c.png").read_bytes()[:8] == PNG

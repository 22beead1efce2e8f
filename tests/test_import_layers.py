"""Layering: learners do not import the training loop (the loop calls learners, not the reverse), and no
module of the package imports one that imports it back, lazily or not (TYPE_CHECKING imports aside)."""
import ast
import subprocess
import sys

from import_graph import _runtime_imports, cycles, import_graph


def _loaded_after(module: str) -> set[str]:
    # Import the learner and build (hence validate) its default config.
    code = (f"import sys, importlib; m = importlib.import_module({module!r}); "
            "getattr(m, 'Config', getattr(m, 'BaseConfig', None))(); "
            "print('\\n'.join(m for m in sys.modules if m.startswith('scaling_rl')))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return set(out.stdout.split())


def test_agents_do_not_import_the_training_loop():
    for agent in ("scaling_rl.agents.sac", "scaling_rl.agents.dqn", "scaling_rl.agents.crl"):
        loaded = _loaded_after(agent)
        assert agent in loaded
        assert "scaling_rl.train" not in loaded, agent


def test_eval_schedule_is_one_function_reexported_by_train():
    from scaling_rl import eval_schedule, train
    assert train.eval_schedule_error is eval_schedule.eval_schedule_error
    assert train.eval_chunks is eval_schedule.eval_chunks
    assert eval_schedule.eval_schedule_error("log", 1).startswith("eval_points")
    assert eval_schedule.eval_schedule_error("log", 4) is None


# --- no import circles, lazy imports included --------------------------------------------------------
def test_the_cycle_finder_finds_a_lazy_circle():
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    tree = ast.parse("import typing\nif typing.TYPE_CHECKING:\n    import x\ndef f():\n    import y\n")
    assert sorted(n.names[0].name for n in _runtime_imports(tree)) == ["typing", "y"]


def test_no_import_circles_in_the_package():
    graph = import_graph()
    assert len(graph) > 50 and "scaling_rl.llm.sources" in graph["scaling_rl.llm.hogwild"]   # lazy edges seen
    assert graph["scaling_rl.llm.source_factory"] >= {"scaling_rl.llm.sources", "scaling_rl.llm.ray_source",
                                                       "scaling_rl.llm.hogwild"}
    assert cycles(graph) == []
    assert cycles(import_graph(type_checking=True)) == []   # nor through the type-only imports

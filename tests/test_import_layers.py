"""Layering: learners do not import the training loop (the loop calls learners, not the reverse), and no
module of the package imports one that imports it back, lazily or not (TYPE_CHECKING imports aside)."""
import ast
import subprocess
import sys
from pathlib import Path


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
PACKAGE = Path(__file__).resolve().parents[1] / "scaling_rl"


def _modules() -> dict[str, Path]:
    out = {}
    for f in PACKAGE.rglob("*.py"):
        parts = list(f.relative_to(PACKAGE.parent).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
        (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _runtime_imports(tree: ast.AST):
    """Import nodes anywhere (module level or inside functions), except under `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def import_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports at run time (a parent package's __init__ is not an edge)."""
    mods = _modules()

    def resolve(name: str) -> str:
        while name and name not in mods:
            name = name.rsplit(".", 1)[0] if "." in name else ""
        return name

    graph = {}
    for mod, path in mods.items():
        pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        deps = set()
        for node in _runtime_imports(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps |= {resolve(a.name) for a in node.names if a.name.startswith("scaling_rl")}
                continue
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            if base.startswith("scaling_rl"):
                deps |= {f"{base}.{a.name}" if f"{base}.{a.name}" in mods else resolve(base) for a in node.names}
        graph[mod] = {d for d in deps if d and d != mod and not mod.startswith(d + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


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

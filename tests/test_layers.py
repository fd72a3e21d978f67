"""The layering of docs/ARCHITECTURE.md, read from the source: no import circles among pto_gpu's
modules (a lazy import inside a function counts), nothing below the compiler imports it, and
the compiler reaches the backends only through their argument convention (cuda_abi)."""

import ast
from pathlib import Path

import pto_gpu

PACKAGE = Path(pto_gpu.__file__).parent
# pyproject's package-dir: the kernel library and the orchestrations live beside the package
SOURCES = {"pto_gpu": PACKAGE, "pto_gpu.kernels": PACKAGE.parent / "kernels",
           "pto_gpu.orchestration": PACKAGE.parent / "orchestration"}


def _modules() -> dict[str, Path]:
    modules = {}
    for package, folder in SOURCES.items():
        for path in folder.rglob("*.py"):
            parts = (package, *path.relative_to(folder).with_suffix("").parts)
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The pto_gpu modules `name` imports, anywhere in its source; `from package import module`
    counts as the module, not the package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            named = [f"{target}.{alias.name}" for alias in node.names]
            found.update(n for n in named if n in modules)
            if target in modules and any(n not in modules for n in named):
                found.add(target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
    return found - {name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle, or None (depth-first search for a back edge)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (found := visit(target)):
                return found
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_cycle_finder_finds_a_circle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_imports_one_that_imports_it_back():
    assert _cycle(_graph()) is None


def test_nothing_below_the_compiler_imports_it_and_it_reaches_backends_only_through_cuda_abi():
    graph = _graph()
    above = ("pto_gpu.isa", "pto_gpu.kernels", "pto_gpu.orchestration", "pto_gpu.cli", "pto_gpu.__main__")
    below = {name: sorted(t for t in targets if t.startswith("pto_gpu.isa"))
             for name, targets in graph.items() if not name.startswith(above)}
    assert {name: targets for name, targets in below.items() if targets} == {}
    compiler = {name: sorted(t for t in targets if t.startswith(("pto_gpu.backends.", "pto_gpu.executors",
                                                                 "pto_gpu.runtime", "pto_gpu.orchestrator"))
                             and t != "pto_gpu.backends.cuda_abi")
                for name, targets in graph.items() if name.startswith("pto_gpu.isa")}
    assert {name: targets for name, targets in compiler.items() if targets} == {}

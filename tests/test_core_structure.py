"""The core's shape: its modules import one another without a cycle, and at the top of the module.

A function imports inside itself only a heavy or optional third-party library (PyTorch, ONNX, ONNX Runtime,
OpenVINO, TVM's compiler parts, ...), with a comment just above that says why it is deferred.
"""

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parent.parent / "collage_core"
# Third-party libraries a function may import for itself: optional, slow to import, or absent from a runtime-only TVM.
DEFERRABLE = {"graphviz", "matplotlib", "ml_dtypes", "onnx", "onnxruntime", "openvino", "pytest", "torch", "tvm", "tvm_ffi"}


def module_name(path: Path, core: Path = CORE) -> str:
    parts = path.relative_to(core.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def core_modules(core: Path = CORE) -> dict[str, Path]:
    return {module_name(path, core): path for path in sorted(core.rglob("*.py"))}


def imported(node, module: str, is_package: bool, modules) -> list[str]:
    """The core modules an import statement loads (``from package import module`` names the module)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name in modules]
    if node.level:
        base = module.split(".")[: None if is_package else -1]
        base = base[: len(base) - node.level + 1]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    submodules = [f"{source}.{alias.name}" for alias in node.names if f"{source}.{alias.name}" in modules]
    if submodules:
        return submodules
    return [source] if source in modules else []


def function_imports(tree: ast.Module):
    """Every import statement inside a function, at any depth."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                if isinstance(inner, (ast.Import, ast.ImportFrom)):
                    yield inner


def is_type_checking_only(tree: ast.Module, node) -> bool:
    return any(isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test) and node in ast.walk(block) for block in tree.body)


def import_graph(core: Path = CORE) -> dict[str, set[str]]:
    """Each core module and the core modules it imports when it is imported (module level, TYPE_CHECKING aside)."""
    modules = core_modules(core)
    graph = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text())
        inner = set(map(id, function_imports(tree)))
        graph[module] = {
            target
            for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in inner and not is_type_checking_only(tree, node)
            for target in imported(node, module, path.name == "__init__.py", modules)
            if target != module
        }
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles: each strongly connected group of more than one module (or a module importing itself)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph.get(module, ())):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1 or module in graph.get(module, ()):
                found.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def misplaced_imports(core: Path = CORE) -> list[str]:
    """Imports inside functions that should be at the top: of the core itself, of a library not deferrable,
    or deferred without a comment above saying why."""
    problems = []
    for module, path in core_modules(core).items():
        lines = path.read_text().splitlines()
        for node in function_imports(ast.parse("\n".join(lines))):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            top = {"collage_core" if getattr(node, "level", 0) else name.split(".")[0] for name in names}
            where = f"{path.relative_to(core.parent)}:{node.lineno}"
            if not top <= DEFERRABLE:
                problems.append(f"{where} imports {', '.join(sorted(top))} inside a function")
                continue
            above = node.lineno - 2
            while above >= 0 and lines[above].strip().startswith(("import ", "from ")):
                above -= 1
            if above < 0 or not lines[above].strip().startswith("#"):
                problems.append(f"{where} defers {', '.join(sorted(top))} without a comment saying why")
    return problems


def test_the_core_has_no_import_cycle():
    graph = import_graph()
    assert "collage_core.optimizer" in graph and "collage_core.measure.worker" in graph
    assert cycles(graph) == []


def test_functions_import_only_deferred_heavy_libraries():
    assert misplaced_imports() == []


def test_a_cycle_and_a_function_level_core_import_are_found(tmp_path):
    core = tmp_path / "collage_core"
    (core / "outputs").mkdir(parents=True)
    (core / "__init__.py").write_text("")
    (core / "outputs" / "__init__.py").write_text("")
    (core / "outputs" / "result.py").write_text("from collage_core.outputs import report\n")
    (core / "outputs" / "report.py").write_text("from . import result\n")
    (core / "worker.py").write_text(
        "def run():\n    from collage_core.outputs import result\n\n"
        "def convert():\n    # Deferred: PyTorch is optional.\n    import torch\n\n"
        "def silent():\n    import onnx\n"
    )
    assert cycles(import_graph(core)) == [["collage_core.outputs.report", "collage_core.outputs.result"]]
    assert misplaced_imports(core) == [
        "collage_core/worker.py:2 imports collage_core inside a function",
        "collage_core/worker.py:9 defers onnx without a comment saying why",
    ]

"""The package's import graph, read from the source (every `import`: at module level, inside functions and under
`if TYPE_CHECKING:`), and the layers it must respect (ARCHITECTURE.md, "Layers")."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "itune_hf"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE

#: The package's layers, lowest first: a module may import from its own layer and the layers below it, never from
#: one above. Each entry is a top-level module or subpackage of `itune_hf`; `""` is `itune_hf/__init__.py`, the
#: public facade on top. ARCHITECTURE.md's "Layers" table lists the same names in the same order.
LAYERS: tuple[str, ...] = (
    "errors",
    "utils",
    "models",
    "data",
    "metrics",
    "presets",
    "hub",
    "adapter",
    "vision",
    "evaluation",
    "training",
    "families",
    "inference",
    "onnx",
    "pipelines",
    "explain",
    "app",
    "_registration",
    "commands",
    "cli",
    "",
)


def module_names(root: Path = ROOT) -> dict[str, Path]:
    """Dotted name -> file, for every module of the package at `root`."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """The package modules `module` imports (a `from X import name` of a submodule counts as importing it)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, path.name == "__init__.py", node)
            submodules = {f"{target}.{alias.name}" for alias in node.names} & known
            found |= submodules or {target}
    return {name for name in found if name in known and name != module}


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the package modules it imports, for the package at `root`."""
    names = module_names(root)
    return {module: imports_of(module, path, set(names)) for module, path in names.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def layer_of(module: str) -> str:
    """The layer a package module belongs to: its top-level module or subpackage (`""` for the package itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def upward_imports(graph: dict[str, set[str]], layers: tuple[str, ...] = LAYERS) -> list[str]:
    """Every import that points to a higher layer, as `"importer (layer) -> imported (layer above)"`; a module whose
    layer is not in `layers` is reported too."""
    rank = {name: index for index, name in enumerate(layers)}
    found = []
    for module in sorted(graph):
        if layer_of(module) not in rank:
            found.append(f"{module}: its layer {layer_of(module)!r} is not in the layer order (tests/import_graph.py)")
            continue
        for target in sorted(graph[module]):
            here, there = layer_of(module), layer_of(target)
            if there in rank and rank[there] > rank[here]:
                found.append(f"{module} ({here or 'itune_hf'}) -> {target} ({there}, above it)")
    return found


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph between layers (top-level modules and subpackages)."""
    packages: dict[str, set[str]] = {}
    for module, targets in graph.items():
        packages.setdefault(layer_of(module), set()).update(
            layer_of(target) for target in targets if layer_of(target) != layer_of(module)
        )
    return packages

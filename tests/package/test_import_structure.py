"""The package's layers (ARCHITECTURE.md, "Layers"): every import points down, none loops, commands do not import each
other, the top level stays small; every module imports on its own, and the model files (the remote code of full
checkpoints) import nothing from the package but their siblings."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap

import pytest
from import_graph import (
    LAYERS,
    ROOT,
    cycles,
    import_graph,
    imports_of,
    layer_of,
    module_names,
    package_graph,
    upward_imports,
)

REMOTE_CODE_PREFIXES = ("configuration_", "modeling_", "processing_")


def test_the_package_has_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 50 and "itune_hf.training" in graph["itune_hf.commands.train"]  # the graph is read
    assert cycles(graph) == []


def test_cycle_detection_finds_a_loop():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_import_points_down_the_layers():
    graph = import_graph()
    assert "itune_hf.models.registry" in graph["itune_hf.families.ituning.training"]  # the graph is read
    upward = upward_imports(graph)
    assert not upward, "imports that point up the layers (ARCHITECTURE.md, Layers):\n" + "\n".join(upward)


def _plant(root, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")


def test_a_planted_upward_import_is_named_wherever_it_hides(tmp_path):
    package = tmp_path / "itune_hf"
    _plant(package, {
        "__init__.py": "", "models/__init__.py": "", "training/__init__.py": "", "training/loop.py": "",
        "utils/__init__.py": "", "utils/files.py": "",
        "models/registry.py": """
            from typing import TYPE_CHECKING
            from ..utils import files
            if TYPE_CHECKING:
                from ..training import TrainingConfig
            def build():
                from itune_hf.training import loop
        """,
    })  # fmt: skip
    found = upward_imports(import_graph(package))
    assert found == [
        "itune_hf.models.registry (models) -> itune_hf.training (training, above it)",
        "itune_hf.models.registry (models) -> itune_hf.training.loop (training, above it)",
    ]


def test_a_module_outside_the_layer_order_is_named(tmp_path):
    _plant(tmp_path / "itune_hf", {"__init__.py": "", "newthing.py": ""})
    assert upward_imports(import_graph(tmp_path / "itune_hf")) == [
        "itune_hf.newthing: its layer 'newthing' is not in the layer order (tests/import_graph.py)"
    ]


def test_architecture_md_lists_the_layers_in_order_and_what_each_imports():
    text = (ROOT.parent / "ARCHITECTURE.md").read_text(encoding="utf-8")
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|") for line in section.splitlines() if line.startswith("| ") and "`" in line]
    names = [row[2].strip().strip("`").split("/")[0].removesuffix(".py") for row in rows]
    assert names == [layer or "__init__" for layer in LAYERS]
    documented = {name: {n.strip() for n in row[4].split(",")} - {"-"} for name, row in zip(names, rows)}
    imported = package_graph(import_graph())
    for layer in LAYERS:
        assert documented[layer or "__init__"] == imported.get(layer, set()), f"ARCHITECTURE.md's row of {layer!r}"


def test_the_top_level_holds_at_most_ten_modules():
    modules = sorted(path.name for path in ROOT.glob("*.py") if path.name != "__init__.py")
    assert len(modules) <= 10, f"{len(modules)} top-level modules: group them into subpackages ({modules})"
    assert {layer_of(name) for name in module_names()} <= set(LAYERS)


def test_commands_do_not_import_each_other():
    # what several commands share lives in a module of commands/ whose name starts with "_" (or in a lower layer)
    graph = import_graph()
    for module, targets in graph.items():
        if module.startswith("itune_hf.commands."):
            siblings = {t for t in targets if t.startswith("itune_hf.commands.")}
            commands = {t for t in siblings if not t.rpartition(".")[2].startswith("_")}
            assert not commands, f"{module} imports the commands {sorted(commands)}: move what they share to a _module"


def _remote_code_files() -> dict[str, set[str]]:
    """Model file -> the package modules it imports, for every model family folder."""
    names = module_names()
    known = set(names)
    return {
        module: imports_of(module, path, known)
        for module, path in names.items()
        if module.startswith("itune_hf.models.") and path.name.startswith(REMOTE_CODE_PREFIXES)
    }


def test_model_files_import_only_their_siblings():
    files = _remote_code_files()
    assert "itune_hf.models.ituning.modeling_ituning" in files
    for module, imported in files.items():
        folder = module.rpartition(".")[0]
        outside = {name for name in imported if name.rpartition(".")[0] != folder}
        assert not outside, f"{module} imports {sorted(outside)}: model files may import only their siblings"
        source = (ROOT.parent / (module.replace(".", "/") + ".py")).read_text(encoding="utf-8")
        absolute = [
            node.module
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("itune_hf")
        ]
        assert not absolute, f"{module} imports {absolute}: remote code cannot import itune_hf"


@pytest.mark.slow
def test_every_module_imports_on_its_own():
    # One fresh itune_hf per module: a forked child of a process that imported only third-party libraries.
    modules = sorted(module_names())
    script = textwrap.dedent(f"""
        import importlib, json, os, sys, traceback
        import torch, transformers, peft, accelerate, datasets  # third-party only: each child imports itune_hf anew
        failures = {{}}
        for name in {modules!r}:
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(read)
                try:
                    importlib.import_module(name)
                    message = b""
                except BaseException:
                    message = traceback.format_exc(limit=3).encode()
                os.write(write, message[-2000:])
                os._exit(0)
            os.close(write)
            with os.fdopen(read, "rb") as pipe:
                message = pipe.read().decode()
            os.waitpid(pid, 0)
            if message:
                failures[name] = message
        print(json.dumps(failures))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    failures = json.loads(result.stdout.strip().splitlines()[-1])
    assert failures == {}, "\n".join(f"{name}:\n{message}" for name, message in failures.items())

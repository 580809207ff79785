"""The package has no import loops, every module imports on its own, and the model files (the remote code of full
checkpoints) import nothing from the package but their siblings."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap

import pytest
from import_graph import ROOT, cycles, import_graph, imports_of, module_names

REMOTE_CODE_PREFIXES = ("configuration_", "modeling_", "processing_")


def test_the_package_has_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 50 and "itune_hf.training" in graph["itune_hf.commands.train"]  # the graph is read
    assert cycles(graph) == []


def test_cycle_detection_finds_a_loop():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


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

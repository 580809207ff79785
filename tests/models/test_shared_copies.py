"""One shared source (`itune_hf/models/_shared/`), generated copies in the family folders (for remote code), and no
module outside a family folder importing from one."""

from __future__ import annotations

import ast
import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "itune_hf"


def fix_copies_module():
    spec = importlib.util.spec_from_file_location("fix_copies", ROOT / "tools" / "fix_copies.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_every_generated_copy_equals_its_source():
    fix_copies = fix_copies_module()
    assert fix_copies.stale_copies() == [], "run `make fix-copies` (and edit itune_hf/models/_shared/, not a copy)"
    assert fix_copies.main(["--check"]) == 0


def test_a_hand_edited_copy_is_named_and_rewritten(tmp_path, monkeypatch, capsys):
    fix_copies = fix_copies_module()
    models = tmp_path / "itune_hf" / "models"
    for folder in ("_shared", *sorted({family for families in fix_copies.COPIES.values() for family in families})):
        shutil.copytree(PACKAGE / "models" / folder, models / folder, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(fix_copies, "MODELS", models)
    monkeypatch.setattr(fix_copies, "SHARED", models / "_shared")
    copy = models / "xgpt" / "images.py"
    copy.write_text(copy.read_text() + "\nMAX_IMAGE_PIXELS = 1\n")
    assert fix_copies.main(["--check"]) == 1
    assert "itune_hf/models/xgpt/images.py differs" in capsys.readouterr().err
    assert fix_copies.main([]) == 0 and fix_copies.main(["--check"]) == 0
    assert "MAX_IMAGE_PIXELS = 1\n" not in copy.read_text()


def _models_copy(tmp_path, monkeypatch):
    """The models folder copied into `tmp_path`, with fix_copies pointed at it."""
    fix_copies = fix_copies_module()
    models = tmp_path / "itune_hf" / "models"
    shutil.copytree(PACKAGE / "models", models, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(fix_copies, "MODELS", models)
    monkeypatch.setattr(fix_copies, "SHARED", models / "_shared")
    return fix_copies, models


def test_a_hand_edited_copied_function_is_named_and_rewritten(tmp_path, monkeypatch, capsys):
    fix_copies, models = _models_copy(tmp_path, monkeypatch)
    modeling = models / "xgpt" / "modeling_xgpt.py"
    original = modeling.read_text()
    assert "# Copied from itune_hf.models._shared.captioning.shift_tokens_right\ndef shift_tokens_right(" in original
    modeling.write_text(original.replace("shifted[:, 0] = decoder_start_token_id", "shifted[:, 0] = pad_token_id"))
    assert fix_copies.main(["--check"]) == 1
    assert "itune_hf/models/xgpt/modeling_xgpt.py differs" in capsys.readouterr().err
    assert fix_copies.main([]) == 0 and modeling.read_text() == original


def test_a_copied_method_keeps_its_indent_and_a_marker_without_a_source_is_refused(tmp_path, monkeypatch, capsys):
    fix_copies, models = _models_copy(tmp_path, monkeypatch)
    settings = models / "ituning" / "settings.py"
    marker = "# Copied from itune_hf.models._shared.settings"
    probe_class = (
        f"\n\nclass Probe:\n    {marker}.SettingsFields.as_dict\n    def as_dict(self):\n        return {{}}\n"
    )
    settings.write_text(settings.read_text() + probe_class)
    assert fix_copies.main([]) == 0
    probe = settings.read_text().split("class Probe:\n", 1)[1]
    assert probe.startswith("    # Copied from") and "        return {name: getattr(self, name) for name" in probe
    settings.write_text(
        settings.read_text() + "\n\n# Copied from itune_hf.models._shared.settings.Nothing\ndef f():\n    pass\n"
    )
    assert fix_copies.main(["--check"]) == 1
    assert "settings.py defines no Nothing" in capsys.readouterr().err


def test_the_shared_sources_import_nothing_from_the_package():
    fix_copies = fix_copies_module()
    copies, blocks = fix_copies.COPIES, fix_copies.block_families()
    for path in (PACKAGE / "models" / "_shared").glob("*.py"):
        carriers = set(copies.get(path.name, ())) | blocks.get(path.name, set())  # families holding any of it
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level == 1 and carriers:  # a sibling shared file: every family holding this one has it whole
                sibling = f"{node.module}.py"
                assert carriers <= set(copies.get(sibling, ())), (
                    f"{path.name} imports .{node.module}, which tools/fix_copies.py does not copy to every family "
                    f"that carries {path.name} (or a block of it)"
                )
                continue
            assert node.level == 0 and not (node.module or "").startswith("itune_hf"), (
                f"{path.name} imports {node.module!r}: a shared file is copied into remote code, which has no itune_hf"
            )


@pytest.mark.parametrize("name", sorted(fix_copies_module().COPIES))
def test_no_module_outside_a_family_imports_a_familys_copy(name):
    stem, families = name.removesuffix(".py"), fix_copies_module().COPIES[name]
    copies = {f"itune_hf.models.{family}.{stem}" for family in families}
    for path in PACKAGE.rglob("*.py"):
        folder = path.parent.relative_to(PACKAGE.parent).as_posix().replace("/", ".")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = folder.split(".")[: len(folder.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, node.module or ""]) if node.level else node.module
            if module in copies:
                assert module.rpartition(".")[0] == folder, (
                    f"{path.relative_to(ROOT)} imports {module}: outside its family, import itune_hf.models._shared"
                )


def test_inside_the_package_a_familys_image_module_is_the_shared_one():
    from itune_hf.models._shared import images
    from itune_hf.models._shared import images as shared
    from itune_hf.models.ituning import images as ituning
    from itune_hf.models.ituning.caption_processing import open_image as ituning_open
    from itune_hf.models.xgpt import images as xgpt
    from itune_hf.models.xgpt.caption_processing import open_image as xgpt_open

    assert ituning is xgpt is shared and ituning.ImageError is images.ImageError
    assert ituning_open is xgpt_open is shared.open_image

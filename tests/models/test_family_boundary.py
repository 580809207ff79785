"""`ModelFamily` is the only way in: code outside a family's own folders (`itune_hf/models/<family>/`, the model;
`itune_hf/families/<family>/`, its training hooks and card) asks a family for what it declares (how it
explains attention, whether its presets take another vision tower, whether training leaves parameters unused, how
`itune params` describes it) instead of comparing against a family's name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from itune_hf.models import families, get_family
from itune_hf.models.registry import ModelFamily

PACKAGE = Path(__file__).resolve().parents[2] / "itune_hf"


def family_names() -> set[str]:
    return {name for family in families().values() for name in (family.name, family.model_type)}


def comparisons_with_family_names(path: Path) -> list[str]:
    """`file:line` of each comparison in `path` with a string that names a registered family."""
    names, found = family_names(), []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for operand in operands:
                values = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
                if any(isinstance(v, ast.Constant) and v.value in names for v in values):
                    where = path.relative_to(PACKAGE.parent) if path.is_relative_to(PACKAGE.parent) else path
                    found.append(f"{where}:{node.lineno}")
    return found


def test_no_module_outside_the_family_folders_compares_against_a_family_name():
    outside = [p for p in PACKAGE.rglob("*.py") if p.relative_to(PACKAGE).parts[0] not in ("models", "families")]
    found = [where for path in outside for where in comparisons_with_family_names(path)]
    assert not found, f"ask the ModelFamily (itune_hf/models/registry.py) instead of comparing names: {found}"


def test_the_scan_finds_a_comparison(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('def f(family):\n    return family.name == "xgpt" or family.name in ("ituning",)\n')
    assert len(comparisons_with_family_names(probe)) == 2


def test_each_family_declares_its_capabilities():
    assert get_family("ituning").explains == "patches" and get_family("xgpt").explains == "regions"
    assert get_family("ituning").takes_vision_model and not get_family("xgpt").takes_vision_model
    assert get_family("xgpt").unused_parameters and not get_family("ituning").unused_parameters
    assert {get_family(name).explains for name in ("clipcap", "crossattn")} == {None}
    for family in families().values():
        if family.describe_preset:
            assert callable(family.load("describe_preset")), family.name


def test_a_family_with_an_unknown_explanation_is_refused():
    with pytest.raises(ValueError, match="explains must be one of"):
        ModelFamily(
            name="toy", model_type="toy", description="", config_class="", model_class="", processor_class="",
            settings_class=None, build_for_training="", saves="full", explains="pixels",
        )  # fmt: skip

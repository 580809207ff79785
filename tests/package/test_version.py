"""Users tell releases apart: `itune --version` prints `itune_hf.__version__`, and the changelog's newest entry is
that version."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import itune_hf
from itune_hf.cli import main

CHANGELOG = Path(__file__).resolve().parents[2] / "CHANGELOG.md"


def test_itune_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"itune {itune_hf.__version__}"


def test_the_changelog_starts_with_the_package_version():
    versions = re.findall(r"^## (\S+)", CHANGELOG.read_text(), flags=re.M)
    assert versions and versions[0] == itune_hf.__version__

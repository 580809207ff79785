"""The declared dependency ranges (setup.cfg), the lock files that pin what `make test` runs, and the one warning
`import itune_hf` gives outside the ranges."""

from __future__ import annotations

import configparser
import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from itune_hf.utils import versions as _versions

ROOT = Path(__file__).resolve().parents[2]
LOCKS = {"newest": ROOT / "requirements" / "lock.txt", "oldest": ROOT / "requirements" / "lock-oldest.txt"}


def setup_cfg_ranges() -> dict[str, SpecifierSet]:
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    lines = [line for line in parser["options"]["install_requires"].splitlines() if line.strip()]
    return {r.name: r.specifier for r in map(Requirement, lines) if r.name in _versions.CHECKED}


def lock(which: str) -> dict[str, str]:
    pins = {}
    for line in LOCKS[which].read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[name] = version
    return pins


def test_the_installed_package_declares_the_ranges_of_setup_cfg():
    declared = {name: SpecifierSet(spec) for name, spec in _versions.declared_ranges().items()}
    assert declared == setup_cfg_ranges(), "reinstall the package (pip install -e .) after editing setup.cfg"
    for name, specifier in declared.items():
        assert any(s.operator == "<" for s in specifier), f"{name}: no upper bound (an untested release would install)"
        assert any(s.operator == ">=" for s in specifier), f"{name}: no lower bound"


def test_each_range_runs_from_the_oldest_lock_to_past_the_newest_lock():
    ranges = setup_cfg_ranges()
    oldest, newest = lock("oldest"), lock("newest")
    for name, specifier in ranges.items():
        low = next(s.version for s in specifier if s.operator == ">=")
        assert oldest[name].startswith(low), f"{name}: lower bound {low} but the oldest lock tests {oldest[name]}"
        assert newest[name] in specifier and oldest[name] in specifier, f"{name}: a lock is outside {specifier}"


@pytest.mark.parametrize("which", sorted(LOCKS))
def test_a_lock_pins_every_package_exactly_and_torch_to_the_cpu_build_on_disk(which):
    pins = lock(which)
    assert pins["torch"] == "2.13.0", "torch: the CPU build this machine has on disk (a newer pin pulls CUDA wheels)"
    assert {"transformers", "peft", "accelerate", "datasets", "pytest", "pip"} <= set(pins)
    assert "itune-hf" not in pins


def test_the_environment_running_the_tests_holds_a_locked_set():
    if os.environ.get("ITUNE_UNLOCKED"):
        pytest.skip("make test-latest runs on the newest releases the ranges allow, not on a lock")
    installed = {name: importlib.metadata.version(name) for name in ("transformers", "peft", "accelerate", "datasets")}
    locks = {which: {name: lock(which)[name] for name in installed} for which in LOCKS}
    assert installed in locks.values(), f"installed {installed}; the locks pin {locks}: run make clean-venv, make test"


def test_no_warning_inside_the_ranges_and_one_naming_the_range_outside(monkeypatch):
    assert _versions.untested_versions() == {}
    monkeypatch.setattr(_versions, "declared_ranges", lambda: {"transformers": ">=5.20,<5.21", "peft": ">=0.21"})
    installed = importlib.metadata.version("transformers")
    if installed.startswith("5.20."):
        monkeypatch.setattr(_versions, "declared_ranges", lambda: {"transformers": ">=5.24,<5.25", "peft": ">=0.21"})
    with pytest.warns(UserWarning) as caught:
        _versions.warn_if_untested()
    assert len(caught) == 1
    message = str(caught[0].message)
    assert f"transformers {installed}" in message and "pip install 'transformers" in message
    assert "peft" not in message


def test_import_itune_hf_is_silent_on_the_tested_versions():
    result = subprocess.run(
        [sys.executable, "-W", "error::UserWarning", "-c", "import itune_hf"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-2000:]

"""`benchmarks/bench_quality.py` run as a user runs it, at the tiniest size: it trains with the package's loop, scores
the test split and writes the comparison and ablation tables (numbers mean nothing at this size; never asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_quality.py"


def test_quality_benchmark_writes_its_tables(tmp_path):
    out = tmp_path / "quality.json"
    command = [sys.executable, str(SCRIPT), "--tiny", "--threads", "1", "--json", str(out), "--data-dir",
               str(tmp_path / "data"), "--out-dir", str(tmp_path / "runs"), "--methods", "clipcap-mlp",
               "--ablations", "init"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| method | seeds | CIDEr" in result.stdout and "| ablation: init |" in result.stdout
    assert "visual tokens" in result.stdout  # the ablations the package has no setting for are named, not faked
    data = json.loads(out.read_text())
    tables = data["tables"]
    assert list(tables["methods"]) == ["ClipCap, MLP mapper"]
    assert list(tables["init"]) == ["zero init", "random init"]
    runs = data["runs"]
    assert len(runs) == 3 and all(0 <= run["CIDEr"] and run["ms_per_step"] > 0 for run in runs)
    assert all("load_before" in run and "load_after" in run for run in runs)  # timings carry the machine load
    assert tables["methods"]["ClipCap, MLP mapper"]["trainable_parameters"] == 56_800
    assert tables["init"]["zero init"]["trainable_parameters"] == tables["init"]["random init"]["trainable_parameters"]
    assert not any((tmp_path / "runs").iterdir())  # trained models are deleted once scored


def test_quality_benchmark_refuses_unknown_methods(tmp_path):
    result = subprocess.run([sys.executable, str(SCRIPT), "--methods", "blip"], capture_output=True, text=True)
    assert result.returncode == 2 and "--methods: unknown blip" in result.stderr

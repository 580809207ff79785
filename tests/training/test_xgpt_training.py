"""XGPT trained the way I-Tuning is, as users run it: kill and `--resume` bit for bit, two-process DDP on CPU.
XGPT trains whole (all but the vision tower) and saves full checkpoints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from itune_hf.data import make_synthetic

from conftest import free_port, kill_once_checkpointed

pytestmark = pytest.mark.slow  # learning runs, subprocesses, kills or benchmarks: only make test-slow runs them

BIN = Path(sys.executable).parent
XGPT = ["--preset", "xgpt-tiny-random", "--batch-size", "4", "--report-to", "none", "--learning-rate", "1e-3"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("xgpt-world")
    return make_synthetic(root / "data", num_images=40, seed=3, image_size=32)


def itune(*args, env=None):
    command = [str(BIN / "itune"), *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})})


def model_weights(directory: Path) -> dict[str, torch.Tensor]:
    return load_file(directory / "model.safetensors")


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_killed_xgpt_run_resumes_bit_for_bit(world, tmp_path):
    common = ["--data", world, *XGPT, "--max-steps", 40, "--save-every", 4, "--eval-split", "none"]
    straight = itune("train", "--output-dir", tmp_path / "straight", *common)
    assert straight.returncode == 0, straight.stderr[-3000:]

    cut = tmp_path / "cut"
    command = [str(BIN / "itune"), "train", "--output-dir", str(cut), *map(str, common)]
    kill_once_checkpointed(command, cut / "checkpoints" / "step-0000004")
    assert not (cut / "checkpoints" / "step-0000040").exists() and not (cut / "model.safetensors").exists()
    checkpoint = cut / "checkpoints" / "step-0000004" / "model.safetensors"
    frozen = [k for k in load_file(checkpoint) if k.startswith("vision_model.")]
    assert not frozen  # checkpoints hold what trains: the frozen vision tower is never written again

    resumed = itune("train", "--output-dir", cut, *common, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert same_weights(model_weights(tmp_path / "straight"), model_weights(cut))


def test_two_process_xgpt_ddp_on_cpu_ends_with_identical_ranks_and_a_full_checkpoint(world, tmp_path):
    out = tmp_path / "ddp"
    launch = [str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1"]
    launch += ["--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port())]
    train = ["-m", "itune_hf.cli", "train", "--output-dir", out, "--data", world, *XGPT, "--max-steps", 4]
    train += ["--save-every", 4, "--eval-split", "none"]
    result = subprocess.run(
        [*launch, *map(str, train)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "ACCELERATE_USE_CPU": "true"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "still referenced after training" not in result.stderr
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["processes"] == 2 and summary["ranks_identical"] is True
    assert (out / "model.safetensors").is_file() and not (out / "adapter_config.json").exists()
    image = sorted((Path(world).parent / "images").iterdir())[0]
    captioned = itune("caption", image, "--model", out, "--num-beams", 2)
    assert captioned.returncode == 0, captioned.stderr[-3000:]


def test_the_example_script_trains_xgpt_too(world, tmp_path):
    script = Path(__file__).resolve().parents[2] / "examples" / "train_itune.py"
    out = tmp_path / "example"
    command = [sys.executable, str(script), "--data", str(world), "--preset", "xgpt-tiny-random"]
    command += ["--max-steps", "3", "--batch-size", "4", "--output-dir", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "model.safetensors").is_file() and (out / "modeling_xgpt.py").is_file()
    image = sorted((Path(world).parent / "images").iterdir())[0]
    assert itune("caption", image, "--model", out, "--num-beams", 2).returncode == 0

"""XGPT learns to caption from the images, run the way a user runs it: `itune cache-features`, `itune train --preset
xgpt-demo-resnet --max-steps 260 --batch-size 16` (the preset's other defaults), `itune eval --shuffled-control`.

What it proves: the captions name the objects of their own image, which a captioner that ignores the image cannot do
(tests/learning_support.py's bar: object F1 at least twice the best constant caption's and 0.2 above the same captions
scored against shuffled images; CIDEr-D above the constant's). Measured on a 2-core CPU (native bf16): object F1 0.42
against the constant's 0.08 and shuffled images' 0.04 (110 steps at batch 32: 0.19, not clear of shuffled images).

`xgpt-demo-resnet` is the paper's Tiny depth (6 shared layers) at a CPU width (256) over the demo's tiny ResNet,
pre-trained by the package on another synthetic world on first use (cached under $ITUNE_CACHE); over the random ViT
of `xgpt-demo` XGPT does not read the shapes (benchmarks/RESULTS.md). `xgpt-tiny` itself (width 768 over CLIP
ViT-B/16) trains the same code but takes too long for the test suite."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from learning_support import assert_learned_from_the_images, blind_floor

from itune_hf.cli import main
from itune_hf.data import make_synthetic

pytestmark = pytest.mark.slow  # learning runs, subprocesses, kills or benchmarks: only make test-slow runs them

BIN = Path(sys.executable).parent


def itune(*args) -> subprocess.CompletedProcess:
    """`itune` in its own process: training and captioning get the CLI's runtime settings (OpenMP spin, glibc
    allocator), which a process that has already loaded torch cannot take on."""
    command = [str(BIN / "itune"), *map(str, args)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, env=dict(os.environ))
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_xgpt_names_the_objects_of_its_own_image_beyond_blind_captioners(tmp_path):
    dataset = make_synthetic(tmp_path / "world", num_images=600, seed=3)
    cache = ["cache-features", "--preset", "xgpt-demo-resnet", "--data", dataset, "--output-dir", tmp_path / "cache"]
    assert main(list(map(str, cache))) == 0  # in-process: one pass of the vision tower, no start-up to pay
    run = tmp_path / "xgpt"
    itune(
        "train", "--preset", "xgpt-demo-resnet", "--data", dataset, "--feature-cache", tmp_path / "cache",
        "--output-dir", run, "--max-steps", 260, "--batch-size", 16, "--eval-split", "none", "--save-every", 260,
        "--report-to", "none", "--max-caption-length", 32, "--seed", 0,
    )  # fmt: skip
    result = itune(
        "eval", "--model", run, "--data", dataset, "--split", "test", "--feature-cache", tmp_path / "cache",
        "--num-beams", 2, "--metrics", "BLEU,CIDEr,Objects", "--shuffled-control", "--output-dir", tmp_path / "eval",
    )  # fmt: skip
    scores = json.loads(result.stdout.strip().splitlines()[-1])
    floor = blind_floor(dataset)
    print(f"XGPT CIDEr {scores['CIDEr']:.3f}, object F1 {scores['Object_F1']:.3f} (shuffled images: "
          f"{scores['Object_F1 (shuffled)']:.3f}); constant caption: CIDEr {floor['CIDEr']:.3f}, object F1 "
          f"{floor['object_caption_scores']['Object_F1']:.3f}")  # fmt: skip
    assert_learned_from_the_images(scores, floor)
    card = (run / "README.md").read_text()
    assert "XGPT model" in card and "not detector regions" in card

"""XGPT learns to caption, run the way a user runs it: `itune cache-features`, `itune train --preset xgpt-demo`,
`itune eval`; its CIDEr must clearly beat the best constant caption (the most frequent training caption).

`xgpt-demo` is the paper's Tiny depth (6 shared layers) at a CPU width (256) over the demo's frozen random tiny ViT:
`xgpt-tiny` itself (width 768 over CLIP ViT-B/16) trains the same code but takes too long for the test suite."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from itune_hf.cli import main
from itune_hf.data import load_captions, make_synthetic
from itune_hf.metrics import score_captions

pytestmark = pytest.mark.slow  # learning runs, subprocesses, kills or benchmarks: make test-fast skips them

BIN = Path(sys.executable).parent


def itune(*args) -> subprocess.CompletedProcess:
    """`itune` in its own process: training and captioning get the CLI's runtime settings (OpenMP spin, glibc
    allocator), which a process that has already loaded torch cannot take on."""
    command = [str(BIN / "itune"), *map(str, args)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, env=dict(os.environ))
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_xgpt_beats_the_best_constant_caption_on_the_synthetic_world(tmp_path):
    dataset = make_synthetic(tmp_path / "world", num_images=600, seed=3)
    cache = ["cache-features", "--preset", "xgpt-demo", "--data", dataset, "--output-dir", tmp_path / "cache"]
    assert main(list(map(str, cache))) == 0  # in-process: one pass of the vision tower, no start-up to pay
    run = tmp_path / "xgpt"
    itune(
        "train", "--preset", "xgpt-demo", "--data", dataset, "--feature-cache", tmp_path / "cache",
        "--output-dir", run, "--max-steps", 110, "--batch-size", 32, "--learning-rate", 1e-3, "--warmup-steps", 10,
        "--eval-split", "none", "--save-every", 110, "--report-to", "none", "--max-caption-length", 32, "--seed", 0,
    )  # fmt: skip
    result = itune(
        "eval", "--model", run, "--data", dataset, "--split", "test", "--feature-cache", tmp_path / "cache",
        "--num-beams", 2, "--metrics", "BLEU,CIDEr", "--output-dir", tmp_path / "eval",
    )  # fmt: skip
    cider = json.loads(result.stdout.strip().splitlines()[-1])["CIDEr"]

    splits = load_captions(dataset)
    constant = Counter(c for captions in splits["train"]["captions"] for c in captions).most_common(1)[0][0]
    test = splits["test"]
    references = {i: list(c) for i, c in zip(test["image_id"], test["captions"])}
    baseline = score_captions({i: constant for i in references}, references, metrics=["CIDEr"])["CIDEr"]
    print(f"XGPT CIDEr {cider:.3f}, constant caption {baseline:.3f}")
    assert cider >= baseline + 0.3, f"XGPT CIDEr {cider:.3f} vs constant caption {constant!r}: {baseline:.3f}"
    card = (run / "README.md").read_text()
    assert "XGPT model" in card and "not detector regions" in card

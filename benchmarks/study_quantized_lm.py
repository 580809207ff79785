"""The demo trained on a frozen LM loaded in full precision, 8 bits and 4 bits (`itune train --load-in`): the same
seed, data and steps; what each costs in memory and what it gives in quality.

For each load, `itune train` runs as a subprocess (the demo's recipe on a world `itune demo` made: its ResNet
stand-in tower and feature cache, the real SmolLM2-135M) while this script polls `/proc/<pid>/status` for the
process's resident memory, then `itune eval` scores the held-out test split (which loads the LM as the run
recorded). Reported per load: the frozen LM's parameter bytes (`frozen_lm.json`; full precision: counted the same
way), the peak resident set (VmHWM) and the peak anonymous resident memory (RssAnon: the LM's weights are read from
a memory-mapped safetensors file, whose pages the kernel can drop, so RssAnon is what the process cannot give back),
seconds per step, the final training loss and the test scores.

Example (the runs of benchmarks/RESULTS.md, "Frozen LM in 8 and 4 bits")::

    itune demo --max-steps 1 --time-budget 0 --data-dir outputs/demo-data   # once: the world, tower, cache
    python benchmarks/study_quantized_lm.py --data-dir outputs/demo-data --steps 40 --output quantized_lm.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

LOADS = ("none", "8bit", "4bit")
STATUS_FIELDS = ("VmHWM", "RssAnon")


def poll_memory(process: subprocess.Popen, every: float = 0.2) -> dict[str, int]:
    """The largest of each `STATUS_FIELDS` value (bytes) seen in `/proc/<pid>/status` until `process` ends."""
    peaks = dict.fromkeys(STATUS_FIELDS, 0)
    status = Path(f"/proc/{process.pid}/status")
    while process.poll() is None:
        try:
            lines = status.read_text().splitlines()
        except OSError:
            break
        for line in lines:
            name, _, value = line.partition(":")
            if name in peaks:
                peaks[name] = max(peaks[name], int(value.split()[0]) * 1024)
        time.sleep(every)
    return peaks


def itune(*args: object) -> list[str]:
    return [sys.executable, "-m", "itune_hf.cli", *map(str, args)]


def train(load: str, data_dir: Path, out: Path, steps: int, seed: int) -> dict:
    """One `itune train` run with `--load-in load`, its memory polled; returns its summary and measurements."""
    command = itune(
        "train", "--preset", "itune-demo-resnet", "--data", data_dir / "dataset.json",
        "--vision-model", data_dir / "vision-tower" / "tower", "--feature-cache", data_dir / "features",
        "--max-steps", steps, "--save-every", steps, "--seed", seed, "--max-caption-length", 32,
        "--eval-split", "none", "--report-to", "none", "--load-in", load, "--output-dir", out, "--overwrite",
    )  # fmt: skip
    started = time.time()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peaks = poll_memory(process)
    log = process.stdout.read()
    if process.wait() != 0:
        raise SystemExit(f"itune train --load-in {load} failed:\n{log[-3000:]}")
    summary = json.loads((out / "train_summary.json").read_text())
    record = out / "frozen_lm.json"
    return {
        "load_in": load,
        "wall_seconds": round(time.time() - started, 1),
        "train_seconds": summary["seconds"],
        "final_loss": summary["final_loss"],
        "history": summary["history"],
        "peak_rss_bytes": peaks["VmHWM"],
        "peak_anonymous_bytes": peaks["RssAnon"],
        "frozen_lm": json.loads(record.read_text()) if record.is_file() else None,
    }


def evaluate(out: Path, data_dir: Path, images: int, beams: int) -> dict:
    """`itune eval` of a run on the test split: CIDEr and the scene metric."""
    command = itune(
        "eval", "--model", out, "--data", data_dir / "dataset.json", "--split", "test", "--max-images", images,
        "--num-beams", beams, "--max-new-tokens", 25, "--feature-cache", data_dir / "features",
        "--metrics", "CIDEr,Objects", "--output-dir", out / "eval", "--overwrite",
    )  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"itune eval of {out} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def full_precision_bytes() -> int:
    """The frozen LM's parameter bytes in full precision, counted as `frozen_lm.json` counts them."""
    from itune_hf.models.quantization import parameter_bytes
    from itune_hf.presets import build_model

    return parameter_bytes(build_model("itune-demo-resnet", pretrained=True).language_model)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path("outputs/demo-data"), help="What itune demo made.")
    parser.add_argument("--work-dir", type=Path, default=Path("outputs/study-quantized-lm"), help="The runs.")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--test-images", type=int, default=100)
    parser.add_argument("--num-beams", type=int, default=3)
    parser.add_argument("--loads", default=",".join(LOADS), help="Comma-separated: none, 8bit, 4bit.")
    parser.add_argument("--output", default=None, help="Write the results as JSON here.")
    args = parser.parse_args()
    rows = []
    for load in args.loads.split(","):
        out = args.work_dir / load
        row = train(load, args.data_dir, out, args.steps, args.seed)
        row["scores"] = evaluate(out, args.data_dir, args.test_images, args.num_beams)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "history"}), flush=True)
    payload = {
        "steps": args.steps,
        "seed": args.seed,
        "test_images": args.test_images,
        "num_beams": args.num_beams,
        "cpus": os.cpu_count(),
        "full_precision_lm_bytes": full_precision_bytes(),
        "runs": rows,
    }
    if args.output:
        Path(args.output).write_text(json.dumps(payload, indent=2) + "\n")


if __name__ == "__main__":
    main()

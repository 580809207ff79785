"""Captions per second of the ONNX export (onnxruntime, CPU) against the torch model in fp32, and how often their
captions agree (issue 31.2), on the test images of a dataset.

    python benchmarks/bench_onnx.py --model outputs/demo --data outputs/demo-data/dataset.json --threads 1

The model is exported once into `--export-dir` (reused when it holds an export). Both runtimes caption the same
batches after one warm-up batch each; the times are the median of `--repeats` passes over the images.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def batches(processor, paths: list[str], batch_size: int) -> list:
    from PIL import Image

    return [
        processor(images=[Image.open(path).convert("RGB") for path in paths[start : start + batch_size]])
        for start in range(0, len(paths), batch_size)
    ]


def caption_all(generate, processor, inputs: list, beams: int, max_new_tokens: int) -> tuple[list[str], float]:
    """The captions of every batch and the seconds they took."""
    import torch

    start = time.perf_counter()
    captions = []
    with torch.no_grad():
        for batch in inputs:
            captions += processor.batch_decode(generate(**batch, num_beams=beams, max_new_tokens=max_new_tokens))
    return captions, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--split", default="test")
    parser.add_argument("--max-images", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--beams", default="1,5")
    parser.add_argument("--max-new-tokens", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--export-dir", default="/tmp/itune-bench-onnx")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from itune_hf.data import load_captions
    from itune_hf.models.loading import load_captioner
    from itune_hf.onnx_export import CONFIG_NAME, export_onnx
    from itune_hf.onnx_runtime import load_onnx_captioner

    model, processor = load_captioner(args.model)
    if not (Path(args.export_dir) / CONFIG_NAME).is_file():
        started = time.perf_counter()
        export_onnx(model, processor, args.export_dir)
        print(f"export: {time.perf_counter() - started:.0f} s", flush=True)
    onnx_model, _ = load_onnx_captioner(args.export_dir, threads=args.threads)
    rows = load_captions(args.data, split=args.split)
    paths = list(rows["image_path"])[: args.max_images]
    inputs = batches(processor, paths, args.batch_size)
    print(f"{len(paths)} images of {args.data} ({args.split}), batch {args.batch_size}, {args.threads} thread(s)")
    print("| beams | torch fp32 captions/s | ONNX captions/s | ONNX / torch | captions equal |\n|---|---|---|---|---|")
    for beams in map(int, args.beams.split(",")):
        results = {}
        for name, generate in (("torch", model.generate), ("onnx", onnx_model.generate)):
            caption_all(generate, processor, inputs[:1], beams, args.max_new_tokens)  # warm-up
            runs = [caption_all(generate, processor, inputs, beams, args.max_new_tokens) for _ in range(args.repeats)]
            results[name] = (runs[0][0], statistics.median(seconds for _, seconds in runs))
        equal = sum(a == b for a, b in zip(results["torch"][0], results["onnx"][0]))
        torch_rate, onnx_rate = (len(paths) / results[name][1] for name in ("torch", "onnx"))
        ratio = onnx_rate / torch_rate
        print(f"| {beams} | {torch_rate:.2f} | {onnx_rate:.2f} | {ratio:.2f}x | {equal} of {len(paths)} |", flush=True)


if __name__ == "__main__":
    main()

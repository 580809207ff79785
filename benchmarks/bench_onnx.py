"""Captions per second of the ONNX export (onnxruntime, CPU) against the torch model in fp32, and how often their
captions agree (issue 31.2), on the test images of a dataset; optionally the int8 decoder and the vocabulary
shortlist (`itune export --quantize int8 --vocabulary CAPTIONS`).

    python benchmarks/bench_onnx.py --model outputs/demo --data outputs/demo-data/dataset.json --threads 1
    python benchmarks/bench_onnx.py --model outputs/demo --data outputs/demo-data/dataset.json --threads 1 \\
        --int8 --vocabulary outputs/demo-data/dataset.json --export-dir /tmp/itune-bench-onnx-int8-shortlist

The model is exported once into `--export-dir` (reused when it holds an export with the same options; another
export there is refused). Rows: torch fp32; with `--vocabulary`, torch fp32 with the same shortlist (the train
split's tokens, as `itune caption --vocabulary` takes them); ONNX with the fp32 decoder; with `--int8`, ONNX with the
int8 decoder. Each runtime captions the same batches after one warm-up batch; the times are the median of
`--repeats` passes over the images; "equal" counts the captions equal to torch fp32's (and, with a shortlist, to
torch's with the shortlist).
"""

from __future__ import annotations

import argparse
import json
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


def export_once(args, vocabulary: list[int] | None) -> None:
    """Export into `--export-dir` unless it holds an export with these options; refuse one with others."""
    from itune_hf.models.loading import load_captioner
    from itune_hf.onnx.export import CONFIG_NAME, export_onnx

    quantize = "int8" if args.int8 else None
    config_path = Path(args.export_dir) / CONFIG_NAME
    if config_path.is_file():
        config = json.loads(config_path.read_text())
        if (config.get("quantize"), config.get("vocabulary")) != (quantize, vocabulary):
            sys.exit(f"{args.export_dir} holds an export with other options; pass another --export-dir")
        return
    model, processor = load_captioner(args.model)
    started = time.perf_counter()
    export_onnx(model, processor, args.export_dir, quantize=quantize, vocabulary=vocabulary)
    print(f"export: {time.perf_counter() - started:.0f} s", flush=True)


def runtimes(args, vocabulary: list[int] | None) -> dict:
    """`{row name: generate}` in the order of the table's rows."""
    from itune_hf.inference import optimize_for_inference
    from itune_hf.models.loading import load_captioner
    from itune_hf.onnx.runtime import load_onnx_captioner

    rows = {"torch fp32": load_captioner(args.model)[0].generate}
    if vocabulary is not None:
        rows["torch fp32 + shortlist"] = optimize_for_inference(
            load_captioner(args.model)[0], vocabulary=vocabulary
        ).generate
    suffix = " + shortlist" if vocabulary is not None else ""
    rows[f"ONNX fp32{suffix}"] = load_onnx_captioner(args.export_dir, threads=args.threads, int8=False)[0].generate
    if args.int8:
        rows[f"ONNX int8{suffix}"] = load_onnx_captioner(args.export_dir, threads=args.threads, int8=True)[0].generate
    return rows


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
    parser.add_argument("--int8", action="store_true", help="Also export and time the int8 decoder.")
    parser.add_argument(
        "--vocabulary", default=None, metavar="CAPTIONS", help="Export (and run torch) with this shortlist too."
    )
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from itune_hf.commands._models import vocabulary_captions
    from itune_hf.data import load_captions
    from itune_hf.inference import caption_vocabulary
    from itune_hf.models.loading import load_captioner

    processor = load_captioner(args.model)[1]
    vocabulary = caption_vocabulary(processor, vocabulary_captions(args.vocabulary)) if args.vocabulary else None
    export_once(args, vocabulary)
    rows = load_captions(args.data, split=args.split)
    paths = list(rows["image_path"])[: args.max_images]
    inputs = batches(processor, paths, args.batch_size)
    shortlist = "" if vocabulary is None else f", shortlist of {len(vocabulary)} tokens"
    setup = f"batch {args.batch_size}, {args.threads} thread(s){shortlist}"
    print(f"{len(paths)} images of {args.data} ({args.split}), {setup}")
    table(runtimes(args, vocabulary), processor, inputs, args)


def table(generators: dict, processor, inputs: list, args) -> None:
    """Time each runtime at each beam width and print the table's rows."""
    images = sum(len(batch["pixel_values"]) for batch in inputs)
    references = [name for name in generators if name.startswith("torch")]
    columns = " | ".join(f"captions equal to {name}'s" for name in references)
    print(f"| beams | runtime | captions/s | / torch fp32 | {columns} |")
    print(f"|---|---|---|---|{'---|' * len(references)}")
    for beams in map(int, args.beams.split(",")):
        results = {}
        for name, generate in generators.items():
            caption_all(generate, processor, inputs[:1], beams, args.max_new_tokens)  # warm-up
            runs = [caption_all(generate, processor, inputs, beams, args.max_new_tokens) for _ in range(args.repeats)]
            results[name] = (runs[0][0], images / statistics.median(seconds for _, seconds in runs))
        for name, (captions, rate) in results.items():
            equal = " | ".join(
                f"{sum(a == b for a, b in zip(captions, results[ref][0]))} of {images}" for ref in references
            )
            ratio = rate / results["torch fp32"][1]
            print(f"| {beams} | {name} | {rate:.2f} | {ratio:.2f}x | {equal} |", flush=True)


if __name__ == "__main__":
    main()

"""`itune caption`: caption image files and folders with a trained captioner."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ._models import (
    add_speed_arguments,
    apply_speed_arguments,
    check_decoding,
    check_model_argument,
    decoder,
    load_model_argument,
)
from ._options import speed_options_given

HELP = (
    "Caption images (files or folders): prints 'path<TAB>caption' per image, or JSON lines with --json. An image "
    "that cannot be read (missing, undecodable, truncated, refused by the size limits) is reported on stderr with "
    "its path and reason and skipped; the others are captioned, and the exit status is then 1."
)
RUNTIMES = ("torch", "onnx")
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ._options import add_adapters, add_max_new_tokens, add_num_beams, positive_int

    parser.add_argument(
        "inputs",
        nargs="+",
        metavar="IMAGE_OR_DIR",
        help="Image files and/or folders of images; '-' reads image paths from stdin, one per line (e.g. from find).",
    )
    parser.add_argument("--model", default=None, help="Directory or Hub id of a full or adapter-only checkpoint.")
    add_adapters(parser, what="each image is captioned with each (a line per adapter, naming it)")
    add_num_beams(parser)
    add_max_new_tokens(parser)
    parser.add_argument("--batch-size", type=positive_int, default=8, help="Images per generate() call.")
    parser.add_argument("--prompt", default=None, help="Optional text the captions continue, e.g. 'a photo of'.")
    parser.add_argument(
        "--datastore",
        default=None,
        metavar="DIR",
        help="A retrieval-augmented model's caption datastore (default: the model's own, MODEL/datastore, when it has "
        "one; itune train --retrieval saves it): each image's prompt is the captions of its nearest datastore images "
        "by the model's tower. Another domain's datastore changes what the model retrieves without training.",
    )
    parser.add_argument("--json", action="store_true", help="Print one JSON object per line: {path, caption}.")
    parser.add_argument("--recursive", action="store_true", help="Also look for images in sub-folders.")
    parser.add_argument("--no-progress", action="store_true", help="Never show the progress bar.")
    parser.add_argument(
        "--runtime",
        choices=RUNTIMES,
        default="torch",
        help="torch (default): --model is a checkpoint; onnx: --model is a directory written by itune export "
        "--format onnx, run by onnxruntime on the CPU (the [onnx] extra), with the int8 decoder and the vocabulary "
        "shortlist it was exported with.",
    )
    add_speed_arguments(parser)


def _with_stdin(inputs: list[str]) -> list[str]:
    """`inputs` with `-` replaced by the lines of stdin (read once)."""
    if "-" not in inputs:
        return inputs
    listed = [line.strip() for line in sys.stdin.read().splitlines() if line.strip()]
    return [path for item in inputs for path in (listed if item == "-" else [item])]


def collect_images(inputs: list[str], recursive: bool = False) -> list[Path]:
    """Expand folders into their image files (sorted); files given explicitly are kept whatever their suffix.

    Args:
        inputs: Paths given on the command line; `-` stands for the paths on stdin, one per line (blank lines
            ignored).
        recursive: Walk sub-folders too.
    """
    paths: list[Path] = []
    for item in _with_stdin(inputs):
        path = Path(item)
        if path.is_dir():
            found = path.rglob("*") if recursive else path.iterdir()
            paths.extend(sorted(p for p in found if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES))
        else:
            paths.append(path)  # a missing or bad file is reported when it is opened
    return paths


_TSV_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def tsv_line(path: Path, caption: str) -> str:
    """`PATH<tab>CAPTION`, one line per image whatever the names hold: a backslash, tab, newline or carriage return
    in either field is written as `\\\\`, `\\t`, `\\n`, `\\r` (a file name holding them cannot forge a row).

    Args:
        path: The image file.
        caption: Its caption.
    """
    return f"{str(path).translate(_TSV_ESCAPES)}\t{caption.translate(_TSV_ESCAPES)}"


def _check_retrieval(args: argparse.Namespace, adapters: dict[str, str] | None) -> bool:
    """Whether the captions retrieve (`--datastore`, or a `--model` trained with retrieval prompts, which holds
    `datastore/`); refused, before anything loads, with what retrieval cannot go with."""
    from ..vision.datastore import DATASTORE_DIR
    from . import CommandError

    folders = [args.model] if args.model else list((adapters or {}).values())
    own = [folder for folder in folders if (Path(folder) / DATASTORE_DIR).is_dir()]
    if not (args.datastore or own):
        return False
    why = f"--datastore {args.datastore}" if args.datastore else f"{own[0]} (trained with retrieval prompts)"
    if args.runtime == "onnx" or adapters is not None:
        raise CommandError(
            f"{why}: retrieval runs with --runtime torch and one --model; drop --runtime onnx / --adapter"
        )
    if args.prompt is not None:
        raise CommandError(f"{why}: the retrieved captions are the prompt; drop --prompt")
    return True


def _load_datastore(args: argparse.Namespace, model):
    """The `CaptionDatastore` the prompts retrieve from (`model_datastore`), or a `CommandError` saying why not."""
    from ..vision.datastore import DATASTORE_DIR, DatastoreError, model_datastore
    from . import CommandError

    try:
        return model_datastore(model, args.datastore, Path(args.model) / DATASTORE_DIR)
    except DatastoreError as error:
        raise CommandError(f"--datastore {args.datastore}: {error}" if args.datastore else str(error)) from None


def _retrieval_inputs(model, processor, store, batch: list, inputs):
    """The batch's inputs with each image's retrieval prompt (`CaptionDatastore.prompts_for_pixels`)."""
    prompts = store.prompts_for_pixels(model, inputs["pixel_values"])
    return processor(images=[image for _, image in batch], text=prompts)


def run(args: argparse.Namespace) -> int:
    from . import CommandError
    from ._options import model_or_adapters

    adapters = model_or_adapters(args)
    if args.runtime == "onnx":
        _check_onnx_arguments(args, adapters)
    elif adapters is None:
        check_model_argument(args.model)
    retrieves = _check_retrieval(args, adapters)
    paths = collect_images(args.inputs, recursive=args.recursive)
    if not paths:
        named = ", ".join("stdin" if item == "-" else item for item in args.inputs)
        raise CommandError(f"no images found in {named}")

    import torch
    from tqdm.auto import tqdm

    from ..evaluation import caption_length, check_caption_length, decoding
    from ..models._shared.images import ImageError, open_image, shortest_edge_of

    captioners, processor = _load_captioners(args, adapters)
    check_decoding(args, next(iter(captioners.values()))())
    generate = decoder(args)
    store = _load_datastore(args, captioners[None]()) if retrieves else None
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    failures = 0
    progress = tqdm(
        total=len(paths), unit="image", file=sys.stderr, disable=args.no_progress or len(paths) <= args.batch_size
    )

    def skip(path: Path, reason: str) -> None:
        nonlocal failures
        failures += 1
        progress.write(f"itune caption: error: {path}: {reason}", file=sys.stderr)

    edge = shortest_edge_of(processor.image_processor)  # the resized size is bounded before anything is allocated
    for start in range(0, len(paths), args.batch_size):
        batch = []
        for path in paths[start : start + args.batch_size]:
            try:
                batch.append((path, open_image(path, shortest_edge=edge)))
            except ImageError as error:
                skip(path, error.reason)
        inputs, batch = _encode(processor, batch, args.prompt, skip)
        for name, activate in captioners.items() if batch else ():
            model = activate()
            if args.prompt is not None and args.runtime == "torch":  # the prompt's positions are the caption's less
                check_caption_length(model, args.max_new_tokens, prompt_tokens=inputs["decoder_input_ids"].shape[1])
            if store is not None:
                inputs = _retrieval_inputs(model, processor, store, batch, inputs)
            with torch.no_grad():
                inputs = inputs.to(device)
                generate_kwargs = {**decoding(args.num_beams), **caption_length(args.max_new_tokens)}
                ids = generate(model, **inputs, **generate_kwargs)
            if store is not None:  # the continuation of the retrieved captions
                ids = ids[:, inputs["decoder_input_ids"].shape[1] :]
            for (path, _), caption in zip(batch, processor.batch_decode(ids)):
                print(_output_line(path, caption, name, as_json=args.json), flush=True)
        progress.update(min(args.batch_size, len(paths) - start))
    progress.close()
    if failures:
        print(
            f"itune caption: {failures} of {len(paths)} images could not be read and were skipped; "
            f"{len(paths) - failures} captioned",
            file=sys.stderr,
        )
    return 1 if failures else 0


def _load_captioners(args: argparse.Namespace, adapters: dict[str, str] | None) -> tuple[dict, object]:
    """`({name: activate}, processor)`: what captions each batch. `activate()` returns the model to call `generate`
    on, on its device; one entry named None for `--model`, else one per adapter used (`--use-adapter`, or all)
    switched on their one shared base."""
    import torch

    from ..evaluation import check_caption_length

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.runtime == "onnx":
        from ..onnx.runtime import load_onnx_captioner

        captioner, processor = load_onnx_captioner(args.model)
        return {None: lambda: captioner}, processor
    if adapters is None:
        model, processor = load_model_argument(args.model, args.load_in)
        _check_reads_images(model, args.model)
        check_caption_length(model, args.max_new_tokens)
        model = apply_speed_arguments(model.to(device), args, processor)
        return {None: lambda: model}, processor
    from ._options import load_adapters_argument

    loaded = load_adapters_argument(adapters)
    check_caption_length(loaded.captioner, args.max_new_tokens)
    loaded.model.to(device)
    names = [args.use_adapter] if args.use_adapter else loaded.names
    return {name: (lambda name=name: loaded.use(name)) for name in names}, loaded.processor


def _check_reads_images(model, name: str) -> None:
    """Refuse, naming `--model`, an XGPT model that reads detector regions: `itune caption` gives it images only."""
    from . import CommandError

    source = getattr(model.config, "visual_source", None)
    if source in ("boxes", "regions"):
        raise CommandError(
            f"--model {name} reads detector regions (visual_source={source!r}), which itune caption "
            "cannot give it; caption with itune eval --region-features FILE (the regions of its images)"
        )


def _check_onnx_arguments(args: argparse.Namespace, adapters: dict[str, str] | None) -> None:
    """`--runtime onnx` runs one exported directory: no `--adapter`, no torch speed options."""
    from . import CommandError

    if adapters is not None:
        raise CommandError("--runtime onnx runs one exported --model; export each adapter (itune export) instead")
    if speed_options_given(args):
        raise CommandError(
            "--int8, --precision and --vocabulary apply to --runtime torch; drop them with onnx (an export takes "
            "int8 and the shortlist as itune export --quantize int8 --vocabulary CAPTIONS)"
        )
    if args.decoding == "fast":
        raise CommandError("--decoding fast compiles torch's decode step; drop it with --runtime onnx")
    from ..models.quantization import RECORDED

    if args.load_in != RECORDED:
        raise CommandError(
            f"--load-in {args.load_in} quantises torch's language model; drop it with --runtime onnx (an export "
            "takes int8 as itune export --quantize int8)"
        )
    if not Path(args.model).is_dir():
        raise CommandError(f"--model {args.model}: no such directory; pass what itune export --format onnx wrote")


def _output_line(path: Path, caption: str, adapter: str | None, *, as_json: bool) -> str:
    """One image's line: `PATH<tab>CAPTION` (or JSON `{path, caption}`), with the adapter's name between them (or
    an `adapter` key) when it came from one of several `--adapter`s."""
    if as_json:
        return json.dumps({"path": str(path), **({"adapter": adapter} if adapter else {}), "caption": caption})
    if adapter:
        return f"{tsv_line(path, adapter)}\t{caption.translate(_TSV_ESCAPES)}"
    return tsv_line(path, caption)


def _encode(processor, batch: list, prompt: str | None, skip) -> tuple:
    """`(inputs, pairs)`: the processor's inputs for the (path, image) pairs of `batch` it takes, and those pairs.
    When the batch fails, each image is tried alone and those that fail go to `skip(path, reason)`, so one bad image
    never costs the others their captions."""
    if not batch:
        return None, []
    try:
        return processor(images=[image for _, image in batch], text=prompt), batch
    except (ValueError, OverflowError, MemoryError, OSError) as error:
        if len(batch) == 1:
            skip(batch[0][0], f"could not be processed ({type(error).__name__}: {error})")
            return None, []
    kept = [pair for pair in batch if _encode(processor, [pair], prompt, skip)[1]]
    return _encode(processor, kept, prompt, skip)

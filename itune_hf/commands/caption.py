"""`itune caption`: caption image files and folders with a trained captioner."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ._options import speed_options_given

HELP = (
    "Caption images (files or folders): prints 'path<TAB>caption' per image, or JSON lines with --json. An image "
    "that cannot be read (missing, undecodable, truncated, refused by the size limits) is reported on stderr with "
    "its path and reason and skipped; the others are captioned, and the exit status is then 1."
)
PRECISIONS = ("fp32", "bf16", "auto")  # itune_hf.inference.PRECISIONS, without importing torch to parse arguments
RUNTIMES = ("torch", "onnx")
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ._options import add_adapters, add_num_beams, positive_int

    parser.add_argument(
        "inputs",
        nargs="+",
        metavar="IMAGE_OR_DIR",
        help="Image files and/or folders of images; '-' reads image paths from stdin, one per line (e.g. from find).",
    )
    parser.add_argument("--model", default=None, help="Directory or Hub id of a full or adapter-only checkpoint.")
    add_adapters(parser, what="each image is captioned with each (a line per adapter, naming it)")
    add_num_beams(parser)
    parser.add_argument("--max-new-tokens", type=positive_int, default=30, help="Longest caption, in tokens.")
    parser.add_argument("--batch-size", type=positive_int, default=8, help="Images per generate() call.")
    parser.add_argument("--prompt", default=None, help="Optional text the captions continue, e.g. 'a photo of'.")
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


def add_speed_arguments(parser: argparse.ArgumentParser) -> None:
    """`--load-in`, how the frozen LM loads, and `--int8`, `--precision` and `--vocabulary`: the opt-in settings of
    `itune_hf.inference.optimize_for_inference`.

    Args:
        parser: The command's parser.
    """
    from ..quantization import LOAD_IN, RECORDED

    parser.add_argument(
        "--load-in",
        choices=(*LOAD_IN, "none"),
        default=RECORDED,
        help="Load the frozen LM quantised, as itune train --load-in does (bitsandbytes), or none (full precision). "
        "Default: as the run was trained (its frozen_lm.json), else full precision.",
    )
    parser.add_argument(
        "--int8",
        action="store_true",
        help="Run the frozen LM in int8 (CPU; faster, captions may change slightly). Default: exact fp32.",
    )
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="fp32",
        help="fp32 (default, exact); bf16 (vision tower and LM in bfloat16, only where the hardware has native "
        "bf16); auto (bf16 where native, else fp32).",
    )
    parser.add_argument(
        "--vocabulary",
        metavar="CAPTIONS",
        default=None,
        help="Caption with a vocabulary shortlist: only the tokens of these training captions (a .txt file, one "
        "caption per line, or a dataset itune train takes: its train split). Faster beam search; a caption changes "
        "only where the model would use another token. Default: the whole vocabulary.",
    )


def apply_speed_arguments(model, args: argparse.Namespace, processor=None):
    """Apply `--int8`/`--precision`/`--vocabulary` to a loaded model (a no-op at the defaults); returns the model.

    Args:
        model: The loaded captioner, already on its device.
        args: Parsed arguments with `int8`, `precision` and `vocabulary`.
        processor: The captioner's processor (needed for `--vocabulary`).
    """
    from . import CommandError

    if not speed_options_given(args):
        return model
    from ..inference import caption_vocabulary, optimize_for_inference
    from ..models.ituning.modeling_ituning import ITuningForCaptioning

    if not isinstance(model, ITuningForCaptioning):
        raise CommandError(
            f"--int8, --precision and --vocabulary apply to I-Tuning captioners; {type(model).__name__} runs without "
            "them (drop these flags)"
        )
    vocabulary = None
    if args.vocabulary:
        vocabulary = caption_vocabulary(processor, vocabulary_captions(args.vocabulary))
    try:
        return optimize_for_inference(model, int8=args.int8, precision=args.precision, vocabulary=vocabulary)
    except ValueError as error:
        message = str(error).replace("int8=True", "--int8").replace("precision=", "--precision ")
        raise CommandError(message.replace("vocabulary:", f"--vocabulary {args.vocabulary}:")) from error


def vocabulary_captions(source: str) -> list[str]:
    """The captions of `--vocabulary`: a text file's non-empty lines, or the train split of a dataset.

    Args:
        source: A `.txt` path, or anything `itune_hf.data.load_captions` loads.
    """
    from . import CommandError

    path = Path(source)
    if path.suffix == ".txt":
        if not path.is_file():
            raise CommandError(f"--vocabulary {source}: no such file")
        captions = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    else:
        from ..data import load_captions

        try:
            rows = load_captions(source, split="train")
        except (OSError, ValueError, KeyError) as error:
            raise CommandError(f"--vocabulary {source}: cannot read its train split ({error})") from error
        captions = [caption for row in rows["captions"] for caption in row]
    if not captions:
        raise CommandError(f"--vocabulary {source}: no captions in it")
    return captions


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


def load_model_argument(model: str, load_in: str | None = "recorded"):
    """`load_captioner(model)` for a command's `--model`: every failure is one line naming `--model` and what was
    tried (a local directory, the presets, a Hub id).

    Args:
        model: The `--model` value.
        load_in: The `--load-in` value (`"8bit"`, `"4bit"`, `"none"`; default: as the run recorded).

    Returns:
        The model (eval mode) and its processor.
    """
    from ..errors import InputError
    from ..models.loading import load_captioner
    from . import CommandError

    check_model_argument(model)
    path = Path(model)
    try:
        return load_captioner(model, load_in=load_in)
    except InputError as error:
        if str(error).startswith("--load-in"):
            raise CommandError(str(error)) from error
        if path.is_dir():
            raise CommandError(f"--model {error}") from error
        reason = str(error.__cause__ or error).strip().splitlines()[0]
        raise CommandError(
            f"--model {model}: no such directory, not a preset (itune params --list), and the Hugging Face Hub id "
            f"could not be loaded ({reason}); pass a checkpoint directory, or a Hub id reachable online or cached"
        ) from error


def check_model_argument(model: str, *, preset_serves: bool = False) -> bool:
    """Refuse, before any work, a `--model` that is a file, a preset name or neither a directory nor a Hub id.

    One rule for every command that takes `--model` (`caption`, `eval`, `explain`, `serve`): a local directory wins;
    a preset name is an untrained setup, refused with the way to train it, and never looked up on the Hub, except
    where `preset_serves` (`itune serve`, whose page is for trying the interface, shows it with random weights and
    says so); anything else must look like a Hub id.

    Args:
        model: The `--model` value.
        preset_serves: The command serves a preset's random weights (returns True for one) instead of refusing it.

    Returns:
        Whether `model` is a preset name (only ever True with `preset_serves`).

    Raises:
        CommandError: naming `--model` and what was tried.
    """
    import re

    from . import CommandError

    path = Path(model)
    if path.exists() and not path.is_dir():
        raise CommandError(f"--model {model}: is a file; pass a checkpoint directory (itune train --output-dir)")
    if not path.exists():
        from ..presets import list_presets

        if model in list_presets():
            if preset_serves:
                return True
            raise CommandError(
                f"--model {model}: a preset (an untrained setup), not a trained captioner; train one with "
                f"itune train --preset {model} --output-dir DIR and pass --model DIR"
            )
        if not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", model) or model.startswith((".", "/")):
            raise CommandError(
                f"--model {model}: no such directory, not a preset (itune params --list) and not a Hugging Face Hub "
                "id; pass a directory written by itune train (or save_captioner) or a Hub id"
            )
    return False


_TSV_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def tsv_line(path: Path, caption: str) -> str:
    """`PATH<tab>CAPTION`, one line per image whatever the names hold: a backslash, tab, newline or carriage return
    in either field is written as `\\\\`, `\\t`, `\\n`, `\\r` (a file name holding them cannot forge a row).

    Args:
        path: The image file.
        caption: Its caption.
    """
    return f"{str(path).translate(_TSV_ESCAPES)}\t{caption.translate(_TSV_ESCAPES)}"


def run(args: argparse.Namespace) -> int:
    from . import CommandError
    from ._options import model_or_adapters

    adapters = model_or_adapters(args)
    if args.runtime == "onnx":
        _check_onnx_arguments(args, adapters)
    elif adapters is None:
        check_model_argument(args.model)
    paths = collect_images(args.inputs, recursive=args.recursive)
    if not paths:
        named = ", ".join("stdin" if item == "-" else item for item in args.inputs)
        raise CommandError(f"no images found in {named}")

    import torch
    from tqdm.auto import tqdm

    from ..evaluation import decoding
    from ..models._shared.images import ImageError, open_image, shortest_edge_of

    captioners, processor = _load_captioners(args, adapters)
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
            with torch.no_grad():
                inputs = inputs.to(device)
                ids = model.generate(**inputs, **decoding(args.num_beams), max_new_tokens=args.max_new_tokens)
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
        from ..onnx_runtime import load_onnx_captioner

        captioner, processor = load_onnx_captioner(args.model)
        return {None: lambda: captioner}, processor
    if adapters is None:
        model, processor = load_model_argument(args.model, args.load_in)
        check_caption_length(model, args.max_new_tokens)
        model = apply_speed_arguments(model.to(device), args, processor)
        return {None: lambda: model}, processor
    from ._options import load_adapters_argument

    loaded = load_adapters_argument(adapters)
    check_caption_length(loaded.captioner, args.max_new_tokens)
    loaded.model.to(device)
    names = [args.use_adapter] if args.use_adapter else loaded.names
    return {name: (lambda name=name: loaded.use(name)) for name in names}, loaded.processor


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

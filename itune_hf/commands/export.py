"""`itune export`: a trained captioner as ONNX graphs for deployment (`itune_hf.onnx.export`)."""

from __future__ import annotations

import argparse

HELP = (
    "Export a trained I-Tuning or XGPT captioner for deployment: --format onnx writes the image graph (I-Tuning: "
    "vision.onnx, the tower; XGPT: encoder.onnx, regions to memory), decoder.onnx (one decoding step with its KV "
    "cache), onnx_config.json and the processor's files; caption with them by "
    "itune caption --runtime onnx --model DIR (needs the [onnx] extra: onnx, onnxscript, onnxruntime). "
    "For I-Tuning, --quantize int8 adds decoder.int8.onnx, which the runtime then runs, and --vocabulary restricts "
    "the LM head to a shortlist."
)
FORMATS = ("onnx",)
QUANTIZE = ("int8",)  # itune_hf.onnx.export.QUANTIZE, without importing torch to parse arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ._options import add_option

    parser.add_argument("--model", required=True, help="Directory or Hub id of a full or adapter-only checkpoint.")
    parser.add_argument("--format", choices=FORMATS, default="onnx", help="What to write (default onnx).")
    add_option(
        parser,
        "--output-dir",
        required=True,
        metavar="DIR",
        help="Where the graphs and the processor go (a directory holding other files is refused).",
    )
    parser.add_argument(
        "--opset",
        type=int,
        default=None,
        help="ONNX opset (default: the exporter's; 18 up to the highest the installed onnxscript converts to).",
    )
    parser.add_argument(
        "--quantize",
        choices=QUANTIZE,
        default=None,
        help="int8: also write decoder.int8.onnx (onnxruntime's dynamic quantisation of the frozen LM's weight "
        "products; the I-Tuning modules and the vision tower stay float), which itune caption --runtime onnx then "
        "runs; captions may change slightly. Default: fp32 only.",
    )
    parser.add_argument(
        "--vocabulary",
        metavar="CAPTIONS",
        default=None,
        help="Export with a vocabulary shortlist: the LM head keeps only the tokens of these training captions (a "
        ".txt file, one caption per line, or a dataset itune train takes: its train split), as itune caption "
        "--vocabulary does. Default: the whole vocabulary.",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="Write into an --output-dir holding files an export did not write."
    )


def run(args: argparse.Namespace) -> int:
    import importlib.util
    from pathlib import Path

    from . import CommandError
    from ._models import check_model_argument, load_model_argument, refuse_retrieval_model, vocabulary_captions

    needed = ("onnx", "onnxscript", *(("onnxruntime",) if args.quantize else ()))  # onnxruntime quantises
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing:
        raise CommandError(f"itune export --format onnx needs {' and '.join(missing)}: pip install 'itune-hf[onnx]'")
    from ..onnx.export import check_opset

    try:
        check_opset(args.opset)  # before the model loads
    except ValueError as error:
        raise CommandError(f"--{error}") from None
    check_model_argument(args.model)
    refuse_retrieval_model(args.model, "itune export")
    from ..utils.output_dirs import check_output_dir

    check_output_dir(args.output_dir)
    captions = vocabulary_captions(args.vocabulary) if args.vocabulary else None
    model, processor = load_model_argument(args.model, load_in=None)  # fp32: a --load-in run's LM as trained
    from ..inference import caption_vocabulary
    from ..onnx.export import CONFIG_NAME, check_exportable
    from ..utils.output_dirs import claim_output_dir

    try:
        check_exportable(model, quantize=args.quantize, vocabulary=bool(args.vocabulary))
    except ValueError as error:
        raise CommandError(f"--model {args.model}: {error}") from None
    claim_output_dir(
        args.output_dir, command="itune export", overwrite=args.overwrite,
        is_previous_output=lambda path: (path / CONFIG_NAME).exists(), inputs=[args.model, args.vocabulary],
    )  # fmt: skip
    output = _export(model, processor, args, None if captions is None else caption_vocabulary(processor, captions))
    graphs = ", ".join(sorted(path.name for path in Path(output).glob("*.onnx")))
    print(f"wrote {output}: {graphs}, {CONFIG_NAME} and the processor's files")
    return 0


def _export(model, processor, args: argparse.Namespace, vocabulary: list[int] | None):
    """`export_onnx` with the command's options; a shortlist it refuses is one line naming `--vocabulary`."""
    from ..onnx.export import export_onnx
    from . import CommandError

    try:
        return export_onnx(model, processor, args.output_dir, opset=args.opset, quantize=args.quantize,
                           vocabulary=vocabulary)  # fmt: skip
    except ValueError as error:
        if str(error).startswith("opset"):
            raise CommandError(f"--{error}") from error
        if not str(error).startswith("vocabulary:"):
            raise
        raise CommandError(str(error).replace("vocabulary:", f"--vocabulary {args.vocabulary}:")) from error

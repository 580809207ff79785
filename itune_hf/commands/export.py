"""`itune export`: a trained captioner as ONNX graphs for deployment (`itune_hf.onnx_export`)."""

from __future__ import annotations

import argparse

HELP = (
    "Export a trained I-Tuning captioner for deployment: --format onnx writes vision.onnx (the tower), decoder.onnx "
    "(one decoding step with its KV cache), onnx_config.json and the processor's files; caption with them by "
    "itune caption --runtime onnx --model DIR (needs the [onnx] extra: onnx, onnxscript, onnxruntime)."
)
FORMATS = ("onnx",)


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
    parser.add_argument("--opset", type=int, default=None, help="ONNX opset (default: the exporter's).")
    parser.add_argument(
        "--overwrite", action="store_true", help="Write into an --output-dir holding files an export did not write."
    )


def run(args: argparse.Namespace) -> int:
    import importlib.util

    from . import CommandError
    from .caption import check_model_argument, load_model_argument

    missing = [name for name in ("onnx", "onnxscript") if importlib.util.find_spec(name) is None]
    if missing:
        raise CommandError(f"itune export --format onnx needs {' and '.join(missing)}: pip install 'itune-hf[onnx]'")
    check_model_argument(args.model)
    from ..errors import check_output_dir

    check_output_dir(args.output_dir)
    model, processor = load_model_argument(args.model)
    from ..onnx_export import CONFIG_NAME, check_exportable, export_onnx
    from ..outputs import claim_output_dir

    try:
        check_exportable(model)
    except ValueError as error:
        raise CommandError(f"--model {args.model}: {error}") from None
    claim_output_dir(
        args.output_dir, command="itune export", overwrite=args.overwrite,
        is_previous_output=lambda path: (path / CONFIG_NAME).exists(),
    )  # fmt: skip
    output = export_onnx(model, processor, args.output_dir, opset=args.opset)
    print(f"wrote {output}: vision.onnx, decoder.onnx, {CONFIG_NAME} and the processor's files")
    return 0

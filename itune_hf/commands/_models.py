"""What the commands that load a trained captioner share: the `--model` argument (checked before work, loaded with
one-line errors) and the speed options (`itune_hf.inference`: `optimize_for_inference`'s settings and the decoding
path; `caption`, `eval`, `explain`, `export`, `serve`)."""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ._options import speed_options_given

if TYPE_CHECKING:
    import torch

PRECISIONS = ("fp32", "bf16", "auto")  # itune_hf.inference.PRECISIONS, without importing torch to parse arguments
DECODINGS = ("auto", "default", "fast")  # itune_hf.inference.DECODINGS, likewise


def refuse_retrieval_model(model: str, command: str) -> None:
    """Refuse a `--model` trained with retrieval prompts (it holds a `datastore/`) for a command that does not
    retrieve them: its captions would come from an input the model never saw.

    Args:
        model: The `--model` value.
        command: The command, for the message (e.g. `"itune export"`).

    Raises:
        CommandError: naming `--model` and the commands that retrieve.
    """
    from pathlib import Path

    from ..vision.datastore import DATASTORE_DIR
    from . import CommandError

    if (Path(model) / DATASTORE_DIR).is_dir():
        raise CommandError(
            f"--model {model} was trained with retrieval prompts (its {DATASTORE_DIR}/), which {command} does not "
            "retrieve: caption with itune caption, itune eval or the image-to-text pipeline, which do"
        )


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


def add_speed_arguments(parser: argparse.ArgumentParser) -> None:
    """`--load-in`, how the frozen LM loads; `--int8`, `--precision` and `--vocabulary`, the opt-in settings of
    `itune_hf.inference.optimize_for_inference`; `--decoding`, the decoding path (`itune_hf.inference.decoding`).

    Args:
        parser: The command's parser.
    """
    from ..models.quantization import LOAD_IN, RECORDED

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
        "--decoding",
        choices=DECODINGS,
        default="auto",
        help="auto (default): on a CUDA GPU, I-Tuning, XGPT and cross-attention captioners decode with a static cache "
        "and a compiled decode step (the first batch compiles it, which can take minutes: for a few images default "
        "starts sooner; a failure to compile warns and falls back), elsewhere as transformers' generate does; "
        "default: always the latter; fast: always the former, on the CPU too.",
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


def check_decoding(args: argparse.Namespace, model) -> None:
    """Refuse, before any image is captioned, `--decoding fast` for a family whose decode step does not trace.

    Args:
        args: Parsed arguments with `decoding`.
        model: The loaded captioner.

    Raises:
        CommandError: `--decoding fast` for a family whose decode step does not trace in one graph.
    """
    from ..inference.decoding import resolve_decoding
    from . import CommandError

    try:
        resolve_decoding(model, args.decoding)
    except ValueError as error:
        raise CommandError(f"--decoding {args.decoding}: {error}") from None


def decoder(args: argparse.Namespace) -> Callable[..., torch.Tensor]:
    """`generate` on the path `--decoding` chooses: called as `decoder(args)(model, **generate_kwargs)`.

    Args:
        args: Parsed arguments with `decoding`.
    """
    from ..inference.decoding import fast_generate

    return functools.partial(fast_generate, decoding=args.decoding)


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


__all__ = [
    "DECODINGS", "PRECISIONS", "add_speed_arguments", "apply_speed_arguments", "check_decoding", "check_model_argument",
    "decoder", "load_model_argument", "refuse_retrieval_model", "vocabulary_captions",
]  # fmt: skip

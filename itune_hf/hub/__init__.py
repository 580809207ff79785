"""Saving captioners the way the Hub expects, and pushing them.

* A native captioning model (`ITuningForCaptioning`, ...) is saved whole: `config.json` (with `auto_map`) and the
  code files, weights, `generation_config.json`, the processor files and, when given one (`card=`), a model card.
* A `PeftModel` is saved as an adapter-only checkpoint, the way its model family says (I-Tuning:
  `itune_hf.adapter.saving`): `adapter_config.json` and `adapter_model.safetensors` (I-Tuning weights only),
  a reference `config.json` (a bare `ITuningConfig` naming the frozen backbones, no weights) beside each adapter,
  the processor files and PEFT's card (`card=` replaces it). Backbones that have no reference (randomly initialised
  ones, as in the offline demo) are saved under `backbones/` and referenced relatively.
  `ITuningForCaptioning.from_pretrained`,
  `AutoModelForImageTextToText`, `pipeline("image-to-text")` and `PeftModel.from_pretrained` all load it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any

from huggingface_hub import HfApi, ModelCard

from ..models import family_of
from ..utils.files import staged_directory

#: What one save writes that an earlier save into the same folder may have written differently (a full checkpoint
#: then an adapter, sharded then whole, with then without a quantised LM): those files it does not rewrite are
#: removed, so the folder loads as what was saved last.
SUPERSEDED_FILES = (
    "model.safetensors", "model-*-of-*.safetensors", "model.safetensors.index.json", "pytorch_model*.bin",
    "pytorch_model.bin.index.json", "adapter_model.safetensors", "adapter_model.bin", "adapter_config.json",
    "backbones", "frozen_lm.json", "generation_config.json",
)  # fmt: skip


def _captioner(model: Any) -> tuple[Any, bool]:
    """The captioning model inside `model` (a model of a registered family), and whether `model` is a PEFT model."""
    base = getattr(model, "get_base_model", None)
    captioner = base() if callable(base) else model
    try:
        family_of(captioner)
    except ValueError:
        raise TypeError(
            f"Expected a captioning model of a registered family (e.g. ITuningForCaptioning) or a PeftModel wrapping "
            f"one, got {type(model).__name__}"
        ) from None
    return captioner, captioner is not model


def save_captioner(
    model: Any,
    save_directory: str | os.PathLike,
    *,
    processor: Any | None = None,
    card: ModelCard | str | None = None,
    **save_kwargs: Any,
) -> Path:
    """Save a captioner (full model or I-Tuning adapter) with its processor and, when given, its model card.

    Args:
        model: A captioning model (saved whole) or a `PeftModel` wrapping one (adapter only, saved the way its
            family says: for I-Tuning, the adapter files plus a reference config naming the frozen backbones).
        save_directory: Target directory (created if needed).
        processor: The processor to save alongside, so `AutoProcessor` and pipelines load from the directory.
        card: Model card (a `ModelCard` or its text) written as `README.md`.
        **save_kwargs: Passed to `save_pretrained` (e.g. `selected_adapters` for PEFT models; `state_dict`: the
            model's weights gathered whole, saved instead of its own, as an FSDP run gives them).

    Returns:
        The directory.

    Every file is written into a temporary folder first and then moved over its namesake (`staged_directory`),
    so a kill mid-save never leaves half a weights file. The weights, adapter, backbone and generation files an
    earlier save left in the folder that this one does not rewrite are then removed (`SUPERSEDED_FILES`).
    """
    directory = Path(save_directory)
    captioner, is_peft = _captioner(model)
    family = family_of(captioner) if is_peft else None
    if family is not None and family.save_adapter is None:
        raise TypeError(f"{family.name} models are trained and saved whole, not as PEFT adapters")
    with staged_directory(
        directory, SUPERSEDED_FILES
    ) as staging:  # a kill mid-save leaves each file whole: the old or the new
        if family is not None:
            family.load("save_adapter")(model, staging, **save_kwargs)
        else:
            captioner.save_pretrained(staging, **save_kwargs)
        if processor is not None:
            processor.save_pretrained(staging)
        if card is not None:
            (staging / "README.md").write_text(str(card), encoding="utf-8")
    return directory


def push_captioner_to_hub(
    model: Any,
    repo_id: str,
    *,
    processor: Any | None = None,
    card: ModelCard | str | None = None,
    private: bool | None = None,
    token: str | None = None,
    commit_message: str | None = None,
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
        commit_message: Message of the upload commit (default: "Upload <family> captioner", e.g. XGPT).
        api: An `HfApi` to use (tests pass a recording one).

    Returns:
        The URL of the commit.

    Raises:
        ConnectionError: the Hub cannot be reached (offline, `HF_HUB_OFFLINE` set): naming the repo and what to do.
    """
    api = api or HfApi(token=token)
    commit_message = commit_message or f"Upload {family_of(model).title} captioner"
    with _reaching_the_hub(repo_id):
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    with tempfile.TemporaryDirectory() as folder:
        save_captioner(model, folder, processor=processor, card=card)
        with _reaching_the_hub(repo_id):
            info = api.upload_folder(
                repo_id=repo_id, folder_path=folder, commit_message=commit_message, repo_type="model"
            )
    return str(info)


def _network_errors() -> tuple[type[BaseException], ...]:
    """The errors a Hub call raises when the Hub cannot be reached, whichever HTTP client huggingface_hub uses."""
    import importlib

    from huggingface_hub.errors import OfflineModeIsEnabled

    errors: list[type[BaseException]] = [ConnectionError, OfflineModeIsEnabled]
    for client in ("httpx2", "httpx", "requests"):
        try:
            module = importlib.import_module(client)
        except ImportError:
            continue
        errors.append(getattr(module, "TransportError", None) or module.ConnectionError)
    return tuple(errors)


@contextlib.contextmanager
def _reaching_the_hub(repo_id: str):
    """Turn the network errors of a Hub call (its HTTP client's, `OfflineModeIsEnabled`) into one
    `ConnectionError` that names the repo and says what to do; any other error passes unchanged."""
    try:
        yield
    except _network_errors() as error:
        offline = " (HF_HUB_OFFLINE is set)" if os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0") else ""
        raise ConnectionError(
            f"push to {repo_id}: the Hugging Face Hub cannot be reached{offline} ({type(error).__name__}: {error}); "
            f"nothing was uploaded. Push again once online, or save_captioner(model, folder) now and upload the "
            f"folder later (hf upload {repo_id} folder)"
        ) from error


__all__ = ["push_captioner_to_hub", "save_captioner"]

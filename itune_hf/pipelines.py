"""`pipeline("image-to-text", model=...)` on transformers 5, where that task was removed.

transformers 5 rewrites the task name `image-to-text` to `image-text-to-text` before consulting its pipeline
registry (and logs that with a broken format string, which prints a traceback), and `ImageTextToTextPipeline`
refuses a call without text. This module is the one place where itune_hf touches transformers' pipeline internals:

1. `ImageToTextPipeline` (a subclass of `ImageTextToTextPipeline`) captions images without a prompt, returns
   `[{"generated_text": caption}]` per image, and routes generation options (`num_beams`, `max_new_tokens`, ...)
   to `generate`. It works for any model whose processor accepts images alone, not only I-Tuning.
2. It is registered under the task `image-to-text` with transformers' public `PIPELINE_REGISTRY`, and
   `transformers.pipelines._resolve_deprecated_task` is wrapped so that a *registered* `image-to-text` is used
   instead of being redirected.
3. The model class of every registered family (`ITuningForCaptioning`, ...) is listed among the image-text-to-text
   models, so prompted captioning through
   `pipeline("image-text-to-text")` does not log "model not supported".
4. The `image-text-to-text` task's implementation becomes `OpenerImageTextToTextPipeline`, a subclass that differs
   from transformers' own only for a processor with an `open_image` method (every family's): paths, URLs and PIL
   images are opened by that method before transformers' `load_image` sees them (which drops transparency and clips
   16-bit values), so both tasks caption the pixels `ITuningProcessor` and `itune caption` give. Other models' inputs
   go through unchanged.

`tests/test_pipelines.py` fails, naming the broken assumption, if transformers changes underneath these.
"""

from __future__ import annotations

import base64
import functools
import os
from collections.abc import Callable, Iterable
from io import BytesIO
from typing import Any

import torch
from PIL import Image
from torch.utils.data import Dataset as TorchDataset
from transformers import AutoModelForImageTextToText
from transformers.pipelines import PIPELINE_REGISTRY, ImageTextToTextPipeline
from transformers.pipelines.base import Pipeline
from transformers.pipelines.image_text_to_text import ReturnType

from .models._shared.images import is_image_input, open_image

TASK = "image-to-text"
PROMPTED_TASK = "image-text-to-text"
GENERATE_OPTIONS = (
    "num_beams", "max_new_tokens", "min_new_tokens", "max_length", "do_sample", "temperature", "top_k", "top_p",
    "num_return_sequences", "length_penalty", "repetition_penalty", "no_repeat_ngram_size", "early_stopping",
)  # fmt: skip


def is_generate_option(name: str) -> bool:
    """Whether a pipeline keyword is for `generate` (a `GenerationConfig` field, or `generation_config` itself)
    rather than for the processor."""
    return name in GENERATE_OPTIONS or name == "generation_config" or name in _generation_fields()


@functools.cache
def _generation_fields() -> frozenset[str]:
    """The fields of a `GenerationConfig`, read once (not one new config per keyword of every call)."""
    from transformers import GenerationConfig

    return frozenset(vars(GenerationConfig()))


class OpenerImageTextToTextPipeline(ImageTextToTextPipeline):
    """transformers' `image-text-to-text` pipeline, except that a processor with an `open_image` method (I-Tuning's,
    XGPT's) opens the images itself, so the pipeline captions the pixels the processor gives (alpha composited on
    white, 16-bit rescaled) instead of those of transformers' `load_image`. Registered for the task when itune_hf is
    imported; other models behave exactly as with transformers' class."""

    def preprocess(self, inputs=None, timeout=None, continue_final_message=None, **processing_kwargs):
        opener = getattr(self.processor, "open_image", None)
        if callable(opener) and isinstance(inputs, dict) and inputs.get("images") is not None:
            inputs = {**inputs, "images": open_pipeline_images(inputs["images"], timeout, opener)}
        return super().preprocess(
            inputs, timeout=timeout, continue_final_message=continue_final_message, **processing_kwargs
        )

    def check_model_type(self, supported_models) -> None:
        """transformers' check, made on the base model of a `PeftModel` (an I-Tuning adapter on its captioner),
        which is as supported as the captioner itself."""
        get_base_model = getattr(self.model, "get_base_model", None)
        if get_base_model is None:
            return super().check_model_type(supported_models)
        model = self.model
        try:
            self.model = get_base_model()
            return super().check_model_type(supported_models)
        finally:
            self.model = model

    def _sanitize_parameters(self, generate_kwargs: dict | None = None, **kwargs):
        # generation options given directly (`num_beams=2`) go to generate, as `image-to-text` takes them, instead
        # of to the processor (which refuses them)
        generate_kwargs = dict(generate_kwargs or {})
        for option in [name for name in kwargs if is_generate_option(name)]:
            generate_kwargs[option] = kwargs.pop(option)
        return super()._sanitize_parameters(generate_kwargs=generate_kwargs or None, **kwargs)


class ImageToTextPipeline(OpenerImageTextToTextPipeline):
    """Image captioning pipeline: `pipe(image)` -> `[{"generated_text": caption}]`.

    Call it with one image (path, URL, PIL image) or a list of them (a list of lists comes back). Generation options
    are keyword arguments: `num_beams`, `max_new_tokens`, `do_sample`, `num_return_sequences`, ...; `prompt=` (or
    `text=`) makes the caption continue a text prefix, returned with the prefix. A retrieval-augmented I-Tuning model
    (`itune train --retrieval`) retrieves its prompt from its own datastore, or from `datastore=` (a folder, e.g.
    `itune make-datastore`'s, or a `CaptionDatastore`: another domain's captions, no training); the caption comes
    back without the prompt. `batch_size` batches images. `decoding=` picks the decoding path
    (`itune_hf.inference.decoding`): `"auto"` (default) takes the fast path (a static cache, a compiled decode step) on
    a CUDA device for I-Tuning, XGPT and cross-attention captioners, the default path elsewhere; `"default"` or
    `"fast"` force one (a prompted caption, `text=`, decodes on the default path, and refuses `"fast"`). Any
    `GenerationConfig` field, or `generation_config=` itself, goes to `generate`; `return_tensors=True` returns
    `{"generated_token_ids": ...}` instead of the text. Works with a multimodal processor (I-Tuning, BLIP, ...) or an
    image processor plus a tokenizer (vision-encoder-decoder captioners).
    """

    # Either a processor, or an image processor and a tokenizer: load whichever the checkpoint has.
    _load_processor = None
    _load_image_processor = None
    _load_tokenizer = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.processor is None and (self.image_processor is None or self.tokenizer is None):
            raise ValueError(
                "image-to-text needs a processor, or an image processor and a tokenizer; the checkpoint provides "
                "neither (pass processor=... or image_processor=... and tokenizer=...)"
            )
        # batched prompts are continued at the end of every row: the processor's tokenizer pads them on the left, and
        # so does the pipeline's own (its batches are collated with it: padding it on the right broke them)
        for tokenizer in {id(t): t for t in (getattr(self.processor, "tokenizer", None), self.tokenizer) if t}.values():
            tokenizer.padding_side = "left"
            if tokenizer.pad_token is None:
                tokenizer.pad_token = tokenizer.eos_token

    def _sanitize_parameters(
        self, prompt: str | None = None, datastore: Any = None, decoding: str | None = None, **kwargs
    ):
        from .inference.decoding import resolve_decoding

        preprocess, forward, postprocess = super()._sanitize_parameters(**kwargs)
        if decoding is not None:
            resolve_decoding(self.model, decoding)  # an unknown path, or "fast" for a family off the fast path: refused
            forward["decoding"] = decoding
        if prompt is not None:
            preprocess["prompt"] = prompt
        if datastore is not None:
            preprocess["datastore"] = datastore
        return preprocess, forward, postprocess

    def _datastore(self, datastore: Any):
        """The `CaptionDatastore` to retrieve from (`model_datastore`: `datastore=`, a folder or a loaded one, else
        the model's own `datastore/` folder); None: no retrieval. Each is loaded once."""
        from pathlib import Path

        from .vision.datastore import DATASTORE_DIR, model_datastore

        loaded = self.__dict__.setdefault("_datastores", {})
        key = datastore if datastore is None or isinstance(datastore, (str, os.PathLike)) else id(datastore)
        if key not in loaded:
            own = Path(str(getattr(self.model, "name_or_path", "") or "")) / DATASTORE_DIR
            loaded[key] = model_datastore(self.model, datastore, own if str(own) != DATASTORE_DIR else None)
        return loaded[key]

    def _retrieved_prompt(self, images: Any, store) -> str:
        """The retrieval prompt of one image (`CaptionDatastore.prompts_for_pixels`)."""
        pixels = self.processor(images=images, return_tensors="pt")["pixel_values"]
        (prompt,) = store.prompts_for_pixels(self.model, pixels)
        return prompt

    def __call__(self, images: Any = None, text: str | list[str] | None = None, **kwargs):
        """Caption `images`: one image, a list (a list of results comes back), or a stream (a generator, a dataset
        column, `KeyDataset(ds, "image")`: an iterator of results comes back, batched by `batch_size`). With
        `text=`, behaves as the `image-text-to-text` pipeline."""
        if text is not None:
            return super().__call__(images, text=text, **kwargs)
        if images is None:
            raise ValueError("Pass an image (path, URL, PIL image) or a list of images to caption.")
        if isinstance(images, (list, tuple)):
            return Pipeline.__call__(self, [_as_input(image) for image in images], **kwargs)
        if _is_single_image(images) or isinstance(images, dict):
            return Pipeline.__call__(self, _as_input(images), **kwargs)
        if isinstance(images, TorchDataset) and hasattr(images, "__len__"):  # KeyDataset: DataLoader, num_workers
            return Pipeline.__call__(self, _InputDataset(images), **kwargs)
        if not isinstance(images, Iterable):
            raise ValueError(f"Cannot caption a {type(images).__name__}: pass an image, a list or an iterable of them")
        return Pipeline.__call__(self, (_as_input(image) for image in images), **kwargs)

    def preprocess(self, inputs=None, timeout=None, prompt: str | None = None, datastore=None, **processing_kwargs):
        if not (isinstance(inputs, dict) and "images" in inputs):  # a chat, or text alone: transformers' own path
            return super().preprocess(inputs, timeout=timeout, **processing_kwargs)
        images = open_pipeline_images(inputs["images"], timeout, getattr(self.processor, "open_image", open_image))
        text = inputs.get("text")
        kwargs = processing_kwargs.pop("processor_kwargs", None) or processing_kwargs
        prompt = text if text is not None else prompt
        store = self._datastore(datastore) if self.processor is not None else None
        if store is not None:
            if prompt is not None:
                raise ValueError("a retrieval-augmented captioner's prompt is the retrieved captions: drop prompt=")
            retrieved = self._retrieved_prompt(images, store)
            model_inputs = self.processor(images=images, text=retrieved, return_tensors="pt").to(dtype=self.dtype)
            model_inputs["retrieved"] = torch.ones(1, dtype=torch.bool)  # the caption is what follows the prompt
            return model_inputs
        if isinstance(prompt, (list, tuple)) and len(prompt) > 1:
            kwargs.setdefault("padding", True)
        if self.processor is not None:
            model_inputs = self.processor(images=images, text=prompt, return_tensors="pt", **kwargs)
        elif prompt is not None:
            raise ValueError("A prompt needs a processor that tokenizes it with the image; this model has none")
        else:
            model_inputs = self.image_processor(images=images, return_tensors="pt", **kwargs)
        model_inputs = model_inputs.to(dtype=self.dtype)
        model_inputs["text"] = prompt
        return model_inputs

    def _forward(self, model_inputs, generate_kwargs=None, decoding: str = "auto"):
        from .inference.decoding import fast_generate

        text = model_inputs.get("text")
        retrieved = model_inputs.pop("retrieved", None) is not None
        if not retrieved and text is not None and not (isinstance(text, list) and all(t is None for t in text)):
            if decoding == "fast":
                raise ValueError(
                    "decoding='fast' with a prompt (text= or prompt=): the pipeline decodes prompted captions on the "
                    "default path; pass decoding='auto' or 'default' (itune caption --prompt decodes them fast)"
                )
            return super()._forward(model_inputs, generate_kwargs=generate_kwargs)  # prompted (batched: [None, ...])
        model_inputs.pop("text", None)
        generate_kwargs = self._prepare_generate_kwargs(dict(generate_kwargs or {}), return_dict_in_generate=False)
        sequences = fast_generate(self.model, decoding, **model_inputs, **generate_kwargs)
        if retrieved:  # the continuation of the retrieved captions
            sequences = sequences[:, model_inputs["decoder_input_ids"].shape[1] :]
        images = next(value.shape[0] for value in model_inputs.values() if torch.is_tensor(value) and value.ndim > 1)
        # (images * per_image, T) -> (images, per_image, T), per_image counted from the output (a keyword, the model's
        # or a passed generation_config may set it): the pipeline's batch unpacking then hands each image its own
        # sequences (postprocess flattens them back)
        return {"captions": sequences.reshape(images, -1, sequences.shape[-1])}

    def postprocess(
        self, model_outputs, skip_special_tokens: bool | None = None, return_type=None, **postprocess_kwargs
    ):
        """Each caption as `{"generated_text": text}`, or `{"generated_token_ids": ids}` with `return_tensors=True`."""
        tensors = return_type == ReturnType.TENSORS
        if "captions" not in model_outputs:  # prompted: prompt + continuation, as image-text-to-text returns
            if return_type is not None:
                postprocess_kwargs["return_type"] = return_type
            outputs = super().postprocess(model_outputs, skip_special_tokens=skip_special_tokens, **postprocess_kwargs)
            key = "generated_token_ids" if tensors else "generated_text"
            return [{key: output[key]} for output in outputs]
        sequences = model_outputs["captions"]
        if sequences.ndim == 3:
            sequences = sequences.flatten(0, 1)
        if tensors:
            return [{"generated_token_ids": sequence} for sequence in sequences]
        skip = True if skip_special_tokens is None else skip_special_tokens
        if self.processor is not None:
            texts = self.processor.post_process_image_text_to_text(sequences, skip_special_tokens=skip)
        else:
            texts = [t.strip() for t in self.tokenizer.batch_decode(sequences, skip_special_tokens=skip)]
        return [{"generated_text": text} for text in texts]


class _InputDataset(TorchDataset):
    """A torch dataset of images (e.g. `KeyDataset(ds, "image")`) as pipeline inputs, keeping its length."""

    def __init__(self, images: TorchDataset) -> None:
        self.images = images

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return _as_input(self.images[index])


def _is_single_image(value: Any) -> bool:
    return isinstance(value, (str, os.PathLike, bytes)) or is_image_input(value) or hasattr(value, "__array__")


def _as_input(image: Any) -> dict[str, Any]:
    """One pipeline input: an image, or a dataset row holding one under "image" / "images"."""
    if isinstance(image, dict):
        if "images" in image:
            return image
        if "image" in image:
            return {"images": image["image"]}
        raise ValueError(f"A dict input needs an 'image' key (a dataset row), got keys {sorted(image)}")
    return {"images": image}


def open_pipeline_images(images: Any, timeout: float | None = None, opener: Callable = open_image) -> Any:
    """`open_pipeline_image` on one image, a list of them, or a list of lists (several images per prompt).

    Args:
        images: One image (path, URL, base64 string, PIL image, array) or a (nested) list of them.
        timeout: Seconds to wait for a URL.
        opener: What turns a fetched image into the model's RGB image (the processor's `open_image`).
    """
    if isinstance(images, (list, tuple)):
        return [open_pipeline_images(image, timeout, opener) for image in images]
    return open_pipeline_image(images, timeout, opener)


def open_pipeline_image(image: Any, timeout: float | None = None, opener: Callable = open_image) -> Image.Image:
    """The image the model sees, opened as `ITuningProcessor` and `itune caption` open it (`open_image`: alpha on
    white, 16-bit rescaled, EXIF applied). URLs and base64 strings are fetched first, without converting the pixels.

    Args:
        image: A path, URL, base64 string, PIL image or array.
        timeout: Seconds to wait for a URL.
        opener: What turns the fetched image into the model's RGB image (the processor's `open_image`).
    """
    if isinstance(image, str) and not os.path.exists(image):
        if image.startswith(("http://", "https://")):
            import httpx

            image = Image.open(BytesIO(httpx.get(image, timeout=timeout, follow_redirects=True).content))
        elif image.startswith("data:image/") or not os.path.splitext(image)[1]:
            try:
                image = Image.open(BytesIO(base64.b64decode(image.split(",")[-1], validate=True)))
            except (ValueError, OSError):
                pass  # not base64: open_image names the missing file
    return opener(image)


def register_image_to_text_pipeline() -> None:
    """Make `pipeline("image-to-text", ...)` build an `ImageToTextPipeline` (idempotent)."""
    import transformers.pipelines as pipelines
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    from .models import families

    for family in families().values():
        model_class_name = family.model_class.rpartition(":")[2]
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES.setdefault(family.model_type, model_class_name)
    _use_opener_for_image_text_to_text()
    if TASK not in PIPELINE_REGISTRY.get_supported_tasks():
        PIPELINE_REGISTRY.register_pipeline(
            TASK, pipeline_class=ImageToTextPipeline, pt_model=AutoModelForImageTextToText, type="multimodal"
        )
    original = pipelines._resolve_deprecated_task
    if getattr(original, "_itune_wrapped", False):
        return

    def resolve_task(task: str) -> str:
        # A registered image-to-text task is served by its pipeline instead of being redirected.
        if task == TASK and TASK in PIPELINE_REGISTRY.get_supported_tasks():
            return task
        return original(task)

    resolve_task._itune_wrapped = True
    pipelines._resolve_deprecated_task = resolve_task


def _use_opener_for_image_text_to_text() -> None:
    """Serve `image-text-to-text` with `OpenerImageTextToTextPipeline` while it is still transformers' own class."""
    entry = PIPELINE_REGISTRY.supported_tasks[PROMPTED_TASK]
    own = (ImageTextToTextPipeline, f"{ImageTextToTextPipeline.__module__}.{ImageTextToTextPipeline.__name__}")
    if entry["impl"] in own:  # a class or its dotted path; another library's registration is left alone
        entry["impl"] = OpenerImageTextToTextPipeline


__all__ = [
    "GENERATE_OPTIONS",
    "ImageToTextPipeline",
    "OpenerImageTextToTextPipeline",
    "open_pipeline_image",
    "open_pipeline_images",
    "register_image_to_text_pipeline",
]

"""The browser demo: caption a photo and see, per word, where the captioner looked (I-Tuning's modules over the
patch grid, or an XGPT model's decoder over its grid cells, drawn as boxes).

`itune serve --model M [--adapter A ...]` and the Space in `examples/space/` both run `build_app`. The captioning
itself lives in `CaptionService` (no gradio involved, so it is tested without a browser): one model is loaded once,
every adapter's I-Tuning weights are kept beside it, and choosing an adapter in the page copies its weights into the
model's modules, so all adapters share one frozen vision tower and one frozen LM.

Every request is bounded: beams, caption length, upload size and image pixels have limits (`Limits`), and a file
that is not an image, or too large, gives a message in the page instead of an error.
"""

from __future__ import annotations

import io
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .explain import DISPLAY_EDGE

ALL = "all"  # the layer/head choice that averages every layer or head


@dataclass(frozen=True)
class Limits:
    """What one request may ask for; the page's sliders stop there and the service refuses more.

    Attributes:
        max_beams: Largest beam size.
        max_new_tokens: Longest caption, in tokens (also bounds the number of heatmaps drawn).
        max_file_bytes: Largest upload, in bytes.
        max_pixels: Largest image, width x height (far below the package's decompression-bomb limit: a demo has no
            use for a 50-megapixel photo, and decoding one would hold the single worker for seconds).
        display_edge: The longest side, in pixels, of the image the heatmaps are drawn over (the caption is of the
            whole image; see `itune_hf.explain.DISPLAY_EDGE`).
    """

    max_beams: int = 5
    max_new_tokens: int = 40
    max_file_bytes: int = 20 * 1024 * 1024
    max_pixels: int = 25_000_000
    display_edge: int = DISPLAY_EDGE


@dataclass
class CaptionResult:
    """What the page shows for one request: the caption and the drawn heatmaps, or a message saying what went wrong.

    Attributes:
        caption: The generated caption ("" when the request failed).
        figure: The image with one heatmap per word, as a PIL image (None when the request failed).
        message: Markdown for the page: what was done, or why not.
    """

    caption: str
    figure: Any
    message: str


@dataclass
class CaptionService:
    """One loaded captioner with named adapters for its I-Tuning modules, and the limits of one request.

    Attributes:
        model: An `ITuningForCaptioning` or an `XGPTForCaptioning` (over a grid of regions) in eval mode.
        processor: Its processor.
        adapters: Adapter name -> its I-Tuning weights under the model's own keys (`ituning.<layer>.<param>`); an
            XGPT model (trained whole, no adapters) has one entry, its own, with nothing to copy.
        limits: The bounds of one request.
        samples: Sample name -> image file (the package's real photos, `itune_hf.data.photos`).
        note: Markdown shown at the top of the page (e.g. that the weights are random).
    """

    model: Any
    processor: Any
    adapters: dict[str, dict[str, Any]]
    limits: Limits = field(default_factory=Limits)
    samples: dict[str, Path] = field(default_factory=dict)
    note: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _active: str | None = field(default=None, repr=False)

    @property
    def layers(self) -> list[int]:
        """The layers whose attention can be shown (the choices of the layer selector): the LM layers that hold an
        I-Tuning module, or XGPT's decoder layers."""
        from .explain import attention_layers

        return attention_layers(self.model)

    @property
    def num_heads(self) -> int:
        """Attention heads per layer (the choices of the head selector)."""
        from .explain import attention_heads

        return attention_heads(self.model)

    @property
    def family(self) -> str:
        """The model family's name, for the page: `"I-Tuning"` or `"XGPT"`."""
        from .models import family_of

        return family_of(self.model).title

    def caption(
        self,
        image_path: str | os.PathLike | None,
        *,
        adapter: str | None = None,
        num_beams: int = 1,
        max_new_tokens: int = 20,
        layer: int | str | None = None,
        head: int | str | None = None,
    ) -> CaptionResult:
        """Caption one image file with the chosen adapter and draw its per-word heatmaps; never raises for bad input.

        Args:
            image_path: The uploaded or sample file (None: nothing was given).
            adapter: Name of the adapter to use (default: the first).
            num_beams: Beam size, 1 to `limits.max_beams`.
            max_new_tokens: Longest caption, 1 to `limits.max_new_tokens`.
            layer: One LM layer's module, or `"all"`/None to average them all.
            head: One head, or `"all"`/None to average them all.
        """
        from .errors import InputError
        from .models._shared.images import ImageError

        try:
            image = self._open(image_path)
            options = self._options(adapter, num_beams, max_new_tokens, layer, head)
        except (ImageError, ValueError) as error:
            return CaptionResult("", None, f"**Cannot caption this:** {error}")
        with self._lock:  # one request at a time: the adapter weights live in the one model
            try:
                explanation, figure = self._explain(image, **options)
            except (InputError, ValueError) as error:
                return CaptionResult("", None, f"**Cannot caption this:** {error}")
        return CaptionResult(explanation.caption, figure, self._describe(explanation, options))

    def _open(self, image_path):
        from .models._shared.images import ImageError, open_image

        if not image_path:
            raise ImageError("input", "no image given: upload a photo or pick a sample")
        path = Path(image_path)
        name = path.name
        if not path.is_file():
            raise ImageError(name, "the file is gone; upload it again")
        size = path.stat().st_size
        if size > self.limits.max_file_bytes:
            raise ImageError(
                name,
                f"{size / 2**20:.1f} MB is more than this demo takes ({self.limits.max_file_bytes / 2**20:.0f} MB)",
            )
        _check_pixels(path, name, self.limits.max_pixels)
        return open_image(path, source=name)

    def _options(self, adapter, num_beams, max_new_tokens, layer, head) -> dict[str, Any]:
        adapter = adapter or next(iter(self.adapters))
        if adapter not in self.adapters:
            raise ValueError(f"unknown adapter {adapter!r}; choose one of {list(self.adapters)}")
        num_beams, max_new_tokens = int(num_beams), int(max_new_tokens)
        if not 1 <= num_beams <= self.limits.max_beams:
            raise ValueError(f"beams must be between 1 and {self.limits.max_beams}, got {num_beams}")
        if not 1 <= max_new_tokens <= self.limits.max_new_tokens:
            raise ValueError(f"max length must be between 1 and {self.limits.max_new_tokens}, got {max_new_tokens}")
        return {
            "adapter": adapter,
            "num_beams": num_beams,
            "max_new_tokens": max_new_tokens,
            "layer": None if layer in (None, "", ALL) else int(layer),
            "head": None if head in (None, "", ALL) else int(head),
        }

    def _explain(self, image, *, adapter: str, **options):
        from .explain import draw_explanation, explain_caption

        self.use_adapter(adapter)
        explanation = explain_caption(self.model, self.processor, image, **options)
        figure = draw_explanation(
            image, explanation, columns=4, image_processor=getattr(self.processor, "image_processor", None),
            display_edge=self.limits.display_edge,
        )  # fmt: skip
        return explanation, figure_to_image(figure)

    def use_adapter(self, name: str) -> None:
        """Copy adapter `name`'s weights into the model's I-Tuning modules (nothing to do if it is active).

        Args:
            name: One of `adapters`.
        """
        if name == self._active:
            return
        import torch

        with torch.no_grad():
            state = self.model.state_dict()
            for key, tensor in self.adapters[name].items():
                state[key].copy_(tensor)
        self._active = name

    def _describe(self, explanation, options: dict[str, Any]) -> str:
        layers = "all layers" if options["layer"] is None else f"layer {options['layer']}"
        heads = "all heads" if options["head"] is None else f"head {options['head']}"
        which = "Adapter" if self.family == "I-Tuning" else "Model"
        return (
            f"{which} `{options['adapter']}`, {options['num_beams']} beam(s): {len(explanation.tokens)} words, "
            f"attention averaged over {layers} and {heads}."
        )


def _check_pixels(path: Path, name: str, max_pixels: int) -> None:
    """Refuse an image with more than `max_pixels` from its header alone (before anything is decoded)."""
    from PIL import Image, UnidentifiedImageError

    from .models._shared.images import ImageError

    try:
        with Image.open(path) as opened:  # reads the header only
            width, height = opened.size
    except (UnidentifiedImageError, Image.DecompressionBombError):
        return  # open_image gives the message
    except OSError as error:
        raise ImageError(name, f"unreadable image data ({error})") from None
    if width * height > max_pixels:
        raise ImageError(
            name, f"{width}x{height} pixels is more than this demo takes ({max_pixels:,} pixels); send a smaller photo"
        )


def figure_to_image(figure):
    """A matplotlib figure rendered as a PIL image (PNG, 100 dpi).

    Args:
        figure: A `matplotlib.figure.Figure`.
    """
    from PIL import Image

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    buffer.seek(0)
    return Image.open(buffer).convert("RGB")


def adapter_weights(model, adapter_path: str | os.PathLike) -> dict[str, Any]:
    """An I-Tuning adapter-only checkpoint's weights under `model`'s own keys, checked to fit `model`.

    Args:
        model: The loaded `ITuningForCaptioning` the adapter will run on.
        adapter_path: Directory (or Hub repo) of the adapter (`adapter_config.json` + `adapter_model.safetensors`).

    Raises:
        ValueError: the path is not an I-Tuning adapter, or its settings or weights do not fit the model.
    """
    from safetensors.torch import load_file

    from .adapter.config import ITuningAdapterConfig
    from .adapter.convert import ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME, adapter_state_to_native, find_adapter_file

    if find_adapter_file(adapter_path, ADAPTER_CONFIG_NAME) is None:
        raise ValueError(f"--adapter {adapter_path}: no {ADAPTER_CONFIG_NAME} there; pass an I-Tuning adapter folder")
    config = ITuningAdapterConfig.from_pretrained(str(adapter_path))
    ours, theirs = _runtime_settings(model.config.settings), _runtime_settings(config.settings)
    if ours != theirs:
        raise ValueError(
            f"--adapter {adapter_path}: its I-Tuning settings ({theirs}) differ from --model's ({ours}); "
            f"serve it with --model {adapter_path} instead"
        )
    weights = find_adapter_file(adapter_path, ADAPTER_WEIGHTS_NAME)
    if weights is None:
        raise ValueError(f"--adapter {adapter_path}: no {ADAPTER_WEIGHTS_NAME} next to its {ADAPTER_CONFIG_NAME}")
    ffn_paths = {f"language_model.{site.path}": site.index for site in model.ffn_sites}
    state = adapter_state_to_native(load_file(str(weights)), ffn_paths)
    expected = module_weights(model)
    if state.keys() != expected.keys():
        raise ValueError(f"--adapter {adapter_path}: its modules sit in other LM layers than --model's")
    for key, tensor in state.items():
        if tensor.shape != expected[key].shape:
            raise ValueError(
                f"--adapter {adapter_path}: {key} has shape {tuple(tensor.shape)}, "
                f"--model's {tuple(expected[key].shape)}"
            )
    return state


def _runtime_settings(settings) -> dict[str, Any]:
    """The settings that change what a module computes from its weights (widths and layers show in the weights)."""
    return {name: getattr(settings, name) for name in ("num_heads", "scale", "attention_scale")}


def module_weights(model) -> dict[str, Any]:
    """A copy of the model's own I-Tuning weights (`ituning.<layer>.<param>` -> tensor).

    Args:
        model: An `ITuningForCaptioning`.
    """
    return {key: tensor.detach().clone() for key, tensor in model.state_dict().items() if key.startswith("ituning.")}


def load_service(
    model: str,
    adapters: list[str] | tuple[str, ...] | dict[str, str] = (),
    *,
    limits: Limits | None = None,
    model_name: str | None = None,
) -> CaptionService:
    """Load `model` (a checkpoint folder, Hub id or preset name) and the adapters to switch between.

    Args:
        model: Full or adapter-only checkpoint (local or Hub), or a preset name (random weights, for trying the page).
        adapters: Adapter-only checkpoints of the same base and settings, offered beside the model's own modules: a
            list (each named after its folder) or {name: directory}.
        limits: Request bounds (default `Limits()`).
        model_name: The page's name for `model`'s own modules (default: its folder's name).

    Raises:
        ValueError: the model is neither an I-Tuning captioner nor an XGPT one over a grid of regions (the page takes
            photos alone: no boxes, no precomputed regions), or an adapter does not fit it.
    """
    from .presets import build_model, build_processor, list_presets

    note = ""
    if model in list_presets():
        captioner, processor = build_model(model).eval(), build_processor(model)
        note = f"Preset `{model}` with **random weights**: the captions are noise; serve a trained checkpoint."
    else:
        from .models.loading import load_captioner

        captioner, processor = load_captioner(model)
    pairs = list(adapters.items()) if isinstance(adapters, dict) else [(None, path) for path in adapters]
    _check_servable(model, captioner, [path for _, path in pairs])
    names: dict[str, dict[str, Any]] = {model_name or _adapter_name(model, set()): module_weights(captioner)}
    for name, path in pairs:
        names[name or _adapter_name(path, set(names))] = adapter_weights(captioner, path)
    return CaptionService(captioner, processor, names, limits or Limits(), sample_photos(), note)


def _check_servable(model: str, captioner, adapters) -> None:
    """Refuse, with the reason, a model the page cannot explain from a photo alone."""
    from .explain import attention_source
    from .models import family_of
    from .vision.datastore import DATASTORE_DIR

    needs = f"--model {model}: the demo needs an I-Tuning captioner with its modules, or an XGPT model"
    retrieves = [path for path in (model, *adapters) if (Path(str(path)) / DATASTORE_DIR).is_dir()]
    if retrieves:  # its captions without the retrieved captions would come from an input it never saw
        raise ValueError(
            f"{retrieves[0]} was trained with retrieval prompts (its datastore/), which the page does not retrieve "
            "yet: caption with itune caption --model or the image-to-text pipeline, which retrieve"
        )
    try:
        source = attention_source(captioner)
    except ValueError:
        raise ValueError(needs) from None
    family = family_of(captioner)
    if adapters and family.saves != "adapter":
        raise ValueError(
            f"--adapter {adapters[0]}: {family.title} models are trained whole and have no adapters; serve each with "
            "its own --model"
        )
    if source == "regions":
        visual = captioner.config.visual_source
        if visual != "grid":
            reads = "object boxes" if visual == "boxes" else "precomputed region features"
            raise ValueError(
                f"--model {model}: this {family.title} model reads {reads} (visual_source={visual!r}) and the demo "
                "takes photos alone; explain its captions with itune explain --boxes / --region-features"
            )
    elif not captioner.image_layers():
        raise ValueError(needs)


def _adapter_name(path: str, taken: set[str]) -> str:
    base = Path(str(path).rstrip("/")).name or str(path)
    name, suffix = base, 2
    while name in taken:
        name, suffix = f"{base}-{suffix}", suffix + 1
    return name


def sample_photos() -> dict[str, Path]:
    """The package's real photos that are installed here (`itune_hf.data.photos`), by name."""
    from .data.photos import locate_photos

    available, _ = locate_photos()
    return {photo.name: path for photo, path in available}


def build_app(service: CaptionService):
    """The gradio page over `service`: upload or pick a photo, choose adapter, beams, length, layer and head.

    Args:
        service: What `load_service` returned.

    Returns:
        A `gradio.Blocks` (call `.launch()` on it).
    """
    import gradio as gr

    limits = service.limits
    family = service.family
    looked = (
        "which grid cells of the image the XGPT decoder attended to"
        if family == "XGPT"
        else "where the I-Tuning cross-attention looked in the image"
    )
    # analytics_enabled=False: no telemetry and no version check (gradio contacts its servers at start otherwise)
    with gr.Blocks(title=f"{family} captioner: where it looks", analytics_enabled=False) as app:
        gr.Markdown(
            f"# {family} captioner: where it looks\nUpload a photo or pick a sample. The caption comes with one "
            f"map per word: {looked} when that word was generated." + (f"\n\n{service.note}" if service.note else "")
        )
        with gr.Row():
            with gr.Column():
                upload = gr.File(label="Photo", type="filepath", elem_id="upload")
                sample = gr.Dropdown(["", *service.samples], value="", label="...or a sample photo", elem_id="sample")
                adapter = gr.Dropdown(
                    list(service.adapters),
                    value=next(iter(service.adapters)),
                    label="Adapter" if family == "I-Tuning" else "Model",
                )
                beams = gr.Slider(1, limits.max_beams, value=min(3, limits.max_beams), step=1, label="Beams")
                length = gr.Slider(
                    1, limits.max_new_tokens, value=min(20, limits.max_new_tokens), step=1, label="Max length (tokens)"
                )
                layer = gr.Dropdown([ALL, *map(str, service.layers)], value=ALL, label="Layer")
                head = gr.Dropdown([ALL, *map(str, range(service.num_heads))], value=ALL, label="Head")
                button = gr.Button("Caption", variant="primary", elem_id="run")
            with gr.Column():
                caption = gr.Textbox(label="Caption", elem_id="caption", interactive=False)
                message = gr.Markdown(elem_id="message")
                heatmap = gr.Image(label="Per-word attention", type="pil", elem_id="heatmap", interactive=False)

        def run(path, sample_name, adapter_name, num_beams, max_new_tokens, layer_choice, head_choice):
            chosen = path or service.samples.get(sample_name or "")
            try:
                result = service.caption(
                    chosen,
                    adapter=adapter_name,
                    num_beams=num_beams,
                    max_new_tokens=max_new_tokens,
                    layer=layer_choice,
                    head=head_choice,
                )
            except Exception as error:  # the page must always answer; the traceback goes to the server's log
                import logging

                logging.getLogger(__name__).exception("captioning failed")
                return "", None, f"**Captioning failed:** {type(error).__name__}: {error}"
            return result.caption, result.figure, result.message

        button.click(run, [upload, sample, adapter, beams, length, layer, head], [caption, heatmap, message])
    return app


def serve(service: CaptionService, *, host: str = "127.0.0.1", port: int | None = None, block: bool = True):
    """Start the page of `service` on `host:port` (gradio's server); returns the `gradio.Blocks`.

    Args:
        service: What `load_service` returned.
        host: Interface to listen on (`0.0.0.0` to be reachable from other machines, as a Space needs).
        port: TCP port (None: gradio's default, 7860, or the next free one).
        block: Keep serving until interrupted (False: return once the server is up, e.g. in tests).
    """
    app = build_app(service)
    app.queue(default_concurrency_limit=1, max_size=16)  # one model: requests wait their turn, a bounded queue
    import gradio as gr

    # system fonts: the page needs nothing from the internet (gradio's default theme fetches Google fonts)
    theme = gr.themes.Default(
        font=["ui-sans-serif", "system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"]
    )
    app.launch(
        theme=theme,
        server_name=host,
        server_port=port,
        max_file_size=service.limits.max_file_bytes,
        prevent_thread_lock=not block,
        show_error=True,
        quiet=not block,
    )
    return app

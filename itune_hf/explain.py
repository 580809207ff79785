"""Where the captioner looks: per generated word, the I-Tuning cross-attention over the image (issue 17).

`explain_caption` captions one image with `output_attentions=True` and turns the modules' cross-attentions into one
heatmap per generated token over the vision tower's patch grid (the CLS token kept apart); `draw_explanation` draws
the image with one heatmap per word into a single matplotlib figure (`itune explain` saves it as a PNG).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Explanation:
    """A caption and, per generated token, where the I-Tuning modules attended.

    Attributes:
        caption: The decoded caption.
        tokens: The generated tokens as text, one per heatmap (special tokens left out).
        heatmaps: `(len(tokens), grid_h, grid_w)` attention over the patch grid, each map summing with its CLS share
            to 1 (so maps of different words are comparable).
        cls_attention: `(len(tokens),)` the attention on the CLS token (shown apart: it has no place in the image).
        layers: The LM layers whose modules were averaged.
        heads: The heads averaged.
        extra: Anything else a caller may want (e.g. the raw `cross_attentions`).
    """

    caption: str
    tokens: list[str]
    heatmaps: np.ndarray
    cls_attention: np.ndarray
    layers: list[int]
    heads: list[int]
    extra: dict[str, Any] = field(default_factory=dict)


def patch_grid_shape(num_visual_tokens: int, *, has_cls: bool) -> tuple[int, int]:
    """The `(rows, cols)` of the square patch grid behind `num_visual_tokens` vision states.

    Args:
        num_visual_tokens: How many vision states the modules attend over.
        has_cls: Whether the first of them is a CLS token.
    """
    patches = num_visual_tokens - int(has_cls)
    side = math.isqrt(patches)
    if side * side != patches:
        raise ValueError(
            f"{num_visual_tokens} visual tokens ({'CLS + ' if has_cls else ''}{patches} patches) are not a square "
            "grid; heatmaps need a square patch grid"
        )
    return side, side


def _has_cls(model, num_visual_tokens: int) -> bool:
    vision = model.config.vision_config
    size, patch = getattr(vision, "image_size", None), getattr(vision, "patch_size", None)
    if isinstance(size, int) and isinstance(patch, int) and patch > 0:
        return num_visual_tokens == (size // patch) ** 2 + 1
    return math.isqrt(num_visual_tokens) ** 2 != num_visual_tokens


def _select(items: list[int], chosen: int | None, what: str) -> list[int]:
    if chosen is None:
        return items
    if chosen not in items:
        raise ValueError(f"--{what} {chosen} has no I-Tuning attention; choose one of {items} (or all, the default)")
    return [chosen]


def _check_family(model) -> None:
    if not hasattr(model, "image_layers"):
        raise ValueError(
            f"explaining captions needs an I-Tuning captioner; {type(model).__name__} runs a fused attention that "
            "returns no attention weights"
        )


def explain_caption(
    model,
    processor,
    image,
    *,
    num_beams: int = 1,
    max_new_tokens: int | None = None,
    layer: int | None = None,
    head: int | None = None,
) -> Explanation:
    """Caption `image` and return, per generated token, where the I-Tuning modules attended.

    The caption is generated as usual (any beam size); the attention is then read from one teacher-forced pass over
    the chosen caption, so under beam search it is the attention of the caption returned, not of a pruned beam.
    Token `t`'s map is the attention of the position that predicted it.

    Args:
        model: An `ITuningForCaptioning` (in eval mode).
        processor: Its processor.
        image: A path, PIL image or array (anything the processor opens).
        num_beams: Beam size (1 = greedy).
        max_new_tokens: Longest caption (default: the model's generation config).
        layer: Average only the module in this LM layer (one of `model.image_layers()`); default all.
        head: Average only this head; default all.

    Raises:
        ValueError: for a model without I-Tuning modules, or a `layer`/`head` that has no attention.
    """
    import torch

    _check_family(model)
    layers = _select(model.image_layers(), layer, "layer")
    device = next(model.parameters()).device
    pixel_values = processor(images=[image], return_tensors="pt")["pixel_values"].to(device)
    with torch.no_grad():
        states = model.encode_images(pixel_values).last_hidden_state
        generate_kwargs = {"max_new_tokens": max_new_tokens} if max_new_tokens else {}
        sequence = model.generate(encoder_outputs=states, num_beams=num_beams, **generate_kwargs)[:1]
        outputs = model(encoder_outputs=states, decoder_input_ids=sequence[:, :-1], output_attentions=True)
    attention, heads = _average(model, outputs.cross_attentions, layers, head)
    return _explanation(model, processor, sequence[0], attention, layers, heads)


def _average(model, cross_attentions, layers: list[int], head: int | None) -> tuple[np.ndarray, list[int]]:
    """`(T, N_v)`: the chosen modules' and heads' attention over the one caption, averaged; and the heads used."""
    import torch

    chosen = [cross_attentions[model.image_layers().index(index)][0] for index in layers]  # (heads, T, N_v) each
    stacked = torch.stack(chosen).float()  # (layers, heads, T, N_v)
    heads = _select(list(range(stacked.shape[1])), head, "head")
    return stacked[:, heads].mean(dim=(0, 1)).cpu().numpy(), heads


def _explanation(model, processor, sequence, attention: np.ndarray, layers: list[int], heads: list[int]):
    """Keep the positions that predicted a real token (not EOS or padding) and split CLS from the patch grid."""
    special = {processor.eos_token_id, processor.pad_token_id}
    generated = sequence[1:].tolist()  # the first id is the decoder start token
    keep = [t for t, token in enumerate(generated) if token not in special]
    tokenizer = processor.tokenizer
    tokens = [tokenizer.decode([generated[t]]).strip() or repr(tokenizer.decode([generated[t]])) for t in keep]
    attention = attention[keep]
    if attention.shape[-1] == 1:
        raise ValueError(
            "the I-Tuning modules of this model attend to one visual token (visual_tokens='cls': the CLS token "
            "alone), so there is no map over the image to draw; explain a model trained with visual_tokens 'all' or "
            "'patches'"
        )
    has_cls = _has_cls(model, attention.shape[-1])
    rows, cols = patch_grid_shape(attention.shape[-1], has_cls=has_cls)
    cls = attention[:, 0] if has_cls else np.zeros(len(keep), dtype=attention.dtype)
    heatmaps = attention[:, int(has_cls) :].reshape(len(keep), rows, cols)
    caption = processor.decode(sequence, skip_special_tokens=True)
    return Explanation(caption, tokens, heatmaps, cls, layers, heads)


def visible_region(image_size: tuple[int, int], image_processor) -> tuple[float, float, float, float]:
    """The part of the original image the patch grid covers, `(left, top, right, bottom)` in its pixels.

    CLIP-style processors resize the shortest edge and centre-crop a square: the grid then covers the central
    square of the image; processors that resize to a fixed size without cropping see the whole image.

    Args:
        image_size: `(width, height)` of the original image.
        image_processor: The processor's image processor.
    """
    width, height = image_size
    crop = getattr(image_processor, "crop_size", None) if getattr(image_processor, "do_center_crop", False) else None
    if not crop:
        return 0.0, 0.0, float(width), float(height)
    size = getattr(image_processor, "size", None) or {}
    shortest = size.get("shortest_edge") if isinstance(size, dict) else None
    scale = shortest / min(width, height) if shortest else 1.0
    crop_w = min(crop.get("width", width * scale) / scale, width)
    crop_h = min(crop.get("height", height * scale) / scale, height)
    left, top = (width - crop_w) / 2, (height - crop_h) / 2
    return left, top, left + crop_w, top + crop_h


def draw_explanation(image, explanation: Explanation, *, columns: int = 4, image_processor=None):
    """The image with the caption, then one panel per generated word with its heatmap laid over the image.

    Args:
        image: The image that was captioned (a path, PIL image or array).
        explanation: What `explain_caption` returned for it.
        columns: Panels per row.
        image_processor: The processor's image processor, to place the grid on the part of the image it saw
            (default: the whole image).

    Returns:
        A `matplotlib.figure.Figure` (no GUI backend involved); `save_explanation` writes it as a PNG.
    """
    from matplotlib.figure import Figure

    from .models.ituning.images import open_image

    picture = np.asarray(open_image(image))
    height, width = picture.shape[:2]
    left, top, right, bottom = (
        visible_region((width, height), image_processor) if image_processor else (0, 0, width, height)
    )
    panels = len(explanation.tokens) + 1
    rows = -(-panels // columns)
    figure = Figure(figsize=(3 * min(columns, panels), 3.2 * rows))
    top_value = float(explanation.heatmaps.max()) if explanation.heatmaps.size else 1.0
    for index in range(panels):
        axes = figure.add_subplot(rows, min(columns, panels), index + 1)
        axes.imshow(picture)
        axes.set_axis_off()
        if index == 0:
            axes.set_title(_wrap(explanation.caption), fontsize=9)
            continue
        word = index - 1
        axes.imshow(
            explanation.heatmaps[word],
            extent=(left, right, bottom, top),
            cmap="jet",
            alpha=0.5,
            vmin=0.0,
            vmax=top_value,
            interpolation="bilinear",
        )
        axes.set_xlim(0, width)
        axes.set_ylim(height, 0)
        axes.set_title(f"{explanation.tokens[word]}  (CLS {explanation.cls_attention[word]:.0%})", fontsize=9)
    figure.suptitle(f"I-Tuning attention, layers {explanation.layers}, heads {explanation.heads}", fontsize=8)
    figure.tight_layout()
    return figure


def save_explanation(image, explanation: Explanation, path, *, columns: int = 4, image_processor=None):
    """Draw the explanation (`draw_explanation`) and write it to `path` as a PNG; returns the path.

    Args:
        image: The image that was captioned.
        explanation: What `explain_caption` returned for it.
        path: Where to write the PNG.
        columns: Panels per row.
        image_processor: See `draw_explanation`.
    """
    from pathlib import Path

    figure = draw_explanation(image, explanation, columns=columns, image_processor=image_processor)
    path = Path(path)
    figure.savefig(path, format="png", dpi=100)
    return path


def _wrap(text: str, width: int = 40) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width)) or "(empty caption)"

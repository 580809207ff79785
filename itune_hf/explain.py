"""Where the captioner looks: per generated word, the attention over the image.

`explain_caption` captions one image with `output_attentions=True` and turns the cross-attentions into one map per
generated token: for I-Tuning, the modules' attention over the vision tower's patch grid (the CLS token kept apart),
drawn as a heatmap; for XGPT, the decoder's attention over its memory's regions (grid cells, object boxes or a
detector's boxes, the CLS region kept apart), drawn as boxes weighted by attention. `draw_explanation` draws the image
with one panel per word into a single matplotlib figure (`itune explain` saves it as a PNG).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: What an explanation's regions are, by source: I-Tuning's patch grid, or XGPT's visual sources.
REGION_KINDS = {
    "patches": "the patch grid",
    "grid": "grid cells",
    "boxes": "object boxes",
    "regions": "detector regions",
}


@dataclass
class Explanation:
    """A caption and, per generated token, where the captioner attended in the image.

    Attributes:
        caption: The decoded caption.
        tokens: The generated tokens as text, one per map (special tokens left out).
        heatmaps: `(len(tokens), grid_h, grid_w)` attention over the patch grid (I-Tuning) or XGPT's grid cells,
            each map summing with its CLS share to 1 (so maps of different words are comparable); None where the
            regions are not a grid (XGPT's object or detector boxes: see `region_attention`).
        cls_attention: `(len(tokens),)` the attention on the CLS token or region (shown apart: it has no place in the
            image); zeros when there is none.
        layers: The layers averaged (I-Tuning: LM layers with a module; XGPT: decoder layers).
        heads: The heads averaged.
        extra: Anything else a caller may want.
        source: What the attention is over: `"patches"` (I-Tuning), or XGPT's `visual_source` (`"grid"`, `"boxes"`,
            `"regions"`); see `REGION_KINDS`.
        boxes: `(N, 4)` normalised x1, y1, x2, y2 of the regions the attention is over (XGPT; the CLS region left
            out): in the frame the image processor produced for `"grid"`/`"boxes"`, in the image for `"regions"`.
            None for I-Tuning, or when the attended positions have no boxes (`note` says why).
        region_attention: `(len(tokens), N)` the attention on each region (XGPT; with `cls_attention`, rows sum to 1).
        memory_share: `(len(tokens),)` the share of the attention that went to the image rather than the caption
            so far (XGPT's shared attention over [regions; caption]; 1 for a separate cross-attention), or None.
        family: The model family, for the figure's title.
        note: Why there is nothing to draw in the image, when that is so (e.g. positions without boxes).
    """

    caption: str
    tokens: list[str]
    heatmaps: np.ndarray | None
    cls_attention: np.ndarray
    layers: list[int]
    heads: list[int]
    extra: dict[str, Any] = field(default_factory=dict)
    source: str = "patches"
    boxes: np.ndarray | None = None
    region_attention: np.ndarray | None = None
    memory_share: np.ndarray | None = None
    family: str = "I-Tuning"
    note: str = ""


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


def attention_source(model) -> str:
    """What the captioner's attention over the image is over, as its family declares (`ModelFamily.explains`):
    `"patches"` (drawn as heatmaps over the patch grid) or `"regions"` (drawn as boxes).

    Args:
        model: A captioning model (or a PEFT model wrapping one).

    Raises:
        ValueError: for a model whose family declares no attention for `itune explain` to draw.
    """
    from .models import families, family_of

    try:
        family = family_of(model)
    except ValueError:
        family = None
    source = family.explains if family is not None else None
    if source is None:
        explaining = " or ".join(f.title for f in families().values() if f.explains)
        what = (
            f"the {family.title} family's ({type(model).__name__}: its family declares no `explains`)"
            if family
            else f"{type(model).__name__}'s (not a captioner of a registered family)"
        )
        raise ValueError(
            f"explaining captions needs an {explaining} captioner: itune explain draws only their attention over the "
            f"image, and does not draw {what}"
        )
    return source


def reads_regions(model) -> bool:
    """Whether `model`'s attention is over regions (drawn as boxes), not over the patch grid.

    Args:
        model: A captioning model whose family explains its attention.
    """
    return attention_source(model) == "regions"


def attention_layers(model) -> list[int]:
    """The layers whose attention over the image `explain_caption` can show: the LM layers with an I-Tuning module
    (patches), every decoder layer (regions).

    Args:
        model: A captioner whose family explains its attention (I-Tuning, XGPT).

    Raises:
        ValueError: for a model of another family (its attention over the image is not available).
    """
    if reads_regions(model):
        return list(range(model.config.num_hidden_layers))
    return model.image_layers()


def attention_heads(model) -> int:
    """Heads per attention whose weights `explain_caption` averages (the choices of `head`).

    Args:
        model: An I-Tuning or XGPT captioner.
    """
    config = model.config
    return int(config.num_attention_heads if reads_regions(model) else config.num_heads)


def _select(items: list[int], chosen: int | None, what: str, family: str = "I-Tuning") -> list[int]:
    if chosen is None:
        return items
    if chosen not in items:
        raise ValueError(f"--{what} {chosen} has no {family} attention; choose one of {items} (or all, the default)")
    return [chosen]


def explain_caption(
    model,
    processor,
    image,
    *,
    num_beams: int | None = 1,
    max_new_tokens: int | None = None,
    layer: int | None = None,
    head: int | None = None,
    boxes: list[list[float]] | None = None,
    regions: dict[str, Any] | None = None,
) -> Explanation:
    """Caption `image` and return, per generated token, where the captioner attended.

    The caption is generated as usual (any beam size); the attention is then read from one teacher-forced pass over
    the chosen caption, so under beam search it is the attention of the caption returned, not of a pruned beam.
    Token `t`'s map is the attention of the position that predicted it. I-Tuning: the modules' attention over the
    patch grid. XGPT: the decoder's attention over the memory's regions, with their boxes.

    Args:
        model: An `ITuningForCaptioning` or `XGPTForCaptioning` (in eval mode).
        processor: Its processor.
        image: A path, PIL image or array (anything the processor opens).
        num_beams: Beam size (1 = greedy; None: the model's generation config).
        max_new_tokens: Longest caption (default: the model's generation config).
        layer: Average only this layer (one of `attention_layers(model)`); default all.
        head: Average only this head; default all.
        boxes: XGPT with `visual_source="boxes"`: the image's object boxes, normalised x1, y1, x2, y2.
        regions: XGPT with `visual_source="regions"`: the image's precomputed regions, as `RegionFeatures.get`
            returns them for its one image id (`region_features`, `region_boxes`, `region_mask`).

    Raises:
        ValueError: for a model of another family, a `layer`/`head` that has no attention, or boxes/regions the
            model does not read (or missing where it does).
    """
    from .evaluation import caption_length, check_caption_length, decoding
    from .models import family_of

    layers = _select(attention_layers(model), layer, "layer", family_of(model).title)  # refuses other families first
    check_caption_length(model, max_new_tokens)
    generate_kwargs = {**decoding(num_beams), **caption_length(max_new_tokens)}
    if reads_regions(model):
        return _explain_regions(model, processor, image, layers, head, generate_kwargs, boxes, regions)
    if boxes is not None or regions is not None:
        raise ValueError("boxes and regions are what XGPT models read; an I-Tuning captioner reads the image alone")
    import torch

    device = next(model.parameters()).device
    inputs = processor(images=[image], return_tensors="pt").to(device)  # as `itune caption`: the caption prefix too
    prompt = inputs["decoder_input_ids"].shape[1]
    with torch.no_grad():
        states = model.encode_images(inputs.pop("pixel_values")).last_hidden_state
        sequence = model.generate(encoder_outputs=states, **inputs, **generate_kwargs)[:1]
        outputs = model(encoder_outputs=states, decoder_input_ids=sequence[:, :-1], output_attentions=True)
    chosen = [outputs.cross_attentions[model.image_layers().index(index)] for index in layers]
    heads = _select(list(range(chosen[0].shape[1])), head, "head")
    attention = _average(chosen, heads)
    return _explanation(model, processor, sequence[0], attention, layers, heads, prompt)


def _average(per_layer: list, heads: list[int]) -> np.ndarray:
    """The chosen layers' and heads' attention of the first sequence, averaged: `(T, ...)` from `(B, heads, T, ...)`
    tensors."""
    import torch

    return torch.stack([tensor[0] for tensor in per_layer]).float()[:, heads].mean(dim=(0, 1)).cpu().numpy()


def _kept_tokens(processor, sequence, prompt: int = 1) -> tuple[list[int], list[str]]:
    """The positions that predicted a generated real token (not EOS or padding), and those tokens as text.

    Args:
        processor: The model's processor.
        sequence: One generated sequence: the `prompt` ids it started from (the decoder start token, then any
            caption prefix), then the caption.
        prompt: How many ids the sequence started from.
    """
    special = {processor.eos_token_id, processor.pad_token_id}
    generated = sequence[prompt:].tolist()
    kept = [t for t, token in enumerate(generated) if token not in special]
    tokenizer = processor.tokenizer
    tokens = [tokenizer.decode([generated[t]]).strip() or repr(tokenizer.decode([generated[t]])) for t in kept]
    return [prompt - 1 + t for t in kept], tokens  # position p predicts the id at p + 1


def _explanation(model, processor, sequence, attention: np.ndarray, layers: list[int], heads: list[int], prompt=1):
    """Keep the positions that predicted a real token (not EOS or padding) and split CLS from the patch grid."""
    keep, tokens = _kept_tokens(processor, sequence, prompt)
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


def _explain_regions(model, processor, image, layers, head, generate_kwargs, boxes, regions) -> Explanation:
    """XGPT: caption, then read the decoder's attention over the memory's regions from a teacher-forced pass."""
    import torch

    visual = _region_inputs(model, processor, image, boxes, regions)
    encoder = model.get_encoder()
    with torch.no_grad():
        if "pixel_values" in visual:  # the vision tower runs once, for the regions' boxes and the memory
            visual["vision_hidden_states"] = encoder.encode_images(visual.pop("pixel_values"))
        _, region_boxes, _ = encoder.regions(
            *(visual.get(name) for name in ("pixel_values", "vision_hidden_states", "region_features")),
            visual.get("region_boxes"),
            visual.get("region_mask"),
        )
        memory = encoder(**visual)
        sequence = model.generate(encoder_outputs=memory, **generate_kwargs)[:1]
        outputs = model(encoder_outputs=memory, decoder_input_ids=sequence[:, :-1], output_attentions=True)
    heads = _select(list(range(attention_heads(model))), head, "head", "XGPT")
    attention = _average([outputs.cross_attentions[index] for index in layers], heads)
    share = _average([outputs.memory_shares[index].unsqueeze(-1) for index in layers], heads)[:, 0]
    boxes = region_boxes[0].float().cpu().numpy()  # one image: no padding regions
    return _region_explanation(model, processor, sequence[0], attention, share, boxes, layers, heads)


def _region_inputs(model, processor, image, boxes, regions) -> dict[str, Any]:
    """The visual inputs an XGPT model reads of `image` (one image), on the model's device; a clear error when the
    model's visual source needs boxes or regions that were not given (or refuses ones that were)."""
    source = model.config.visual_source
    device = next(model.parameters()).device
    if source == "regions":
        if regions is None:
            raise ValueError(
                "this XGPT model reads precomputed region features (visual_source='regions'), not the image: pass "
                "the image's regions (itune explain --region-features PATH [--image-id ID])"
            )
        if boxes is not None:
            raise ValueError("the model reads precomputed regions, whose boxes come with them: drop the boxes")
        inputs = {name: regions[name] for name in ("region_features", "region_boxes", "region_mask") if name in regions}
        if inputs["region_features"].shape[0] != 1:
            raise ValueError(f"regions for {inputs['region_features'].shape[0]} images; explain one image at a time")
        return {name: value.to(device) for name, value in inputs.items()}
    if regions is not None:
        raise ValueError(f"the model reads images (visual_source={source!r}), not precomputed regions: drop them")
    if source == "boxes" and not boxes:
        raise ValueError(
            "this XGPT model pools its regions in object boxes (visual_source='boxes'): pass the image's boxes, "
            "normalised x1, y1, x2, y2 (itune explain --boxes)"
        )
    if source == "grid" and boxes is not None:
        raise ValueError("this XGPT model reads a fixed grid of regions (visual_source='grid'), not boxes: drop them")
    inputs = processor(images=[image], boxes=[boxes] if source == "boxes" else None, return_tensors="pt")
    names = ("pixel_values", "region_boxes", "region_mask")
    return {name: inputs[name].to(device) for name in names if name in inputs}


def _region_explanation(model, processor, sequence, attention, share, boxes, layers, heads) -> Explanation:
    """Keep the positions that predicted a real token, and split the CLS region from the regions with a place."""
    config = model.config
    keep, tokens = _kept_tokens(processor, sequence)
    attention, share = attention[keep], share[keep]
    has_cls = config.visual_source != "regions" and bool(config.use_cls_region)
    cls = attention[:, 0] if has_cls else np.zeros(len(keep), dtype=attention.dtype)
    placed, boxes = attention[:, int(has_cls) :], boxes[int(has_cls) :]
    note, heatmaps = "", None
    if placed.shape[1] != boxes.shape[0]:
        note = (
            f"the model attended over {attention.shape[1]} memory positions but only {len(boxes) + has_cls} are "
            "image regions with a box: there is nothing to place in the image"
        )
        boxes = None
    elif config.visual_source == "grid" and math.isqrt(placed.shape[1]) ** 2 == placed.shape[1]:
        side = math.isqrt(placed.shape[1])
        heatmaps = placed.reshape(len(keep), side, side)
    caption = processor.decode(sequence, skip_special_tokens=True)
    return Explanation(
        caption, tokens, heatmaps, cls, layers, heads, source=config.visual_source, boxes=boxes,
        region_attention=placed, memory_share=share, family="XGPT", note=note,
    )  # fmt: skip


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
    from .models._shared.images import shortest_edge_of

    shortest = shortest_edge_of(image_processor)  # its `size` a dict, or transformers 5's SizeDict
    scale = shortest / min(width, height) if shortest else 1.0
    crop_w = min((_size_field(crop, "width") or width * scale) / scale, width)
    crop_h = min((_size_field(crop, "height") or height * scale) / scale, height)
    left, top = (width - crop_w) / 2, (height - crop_h) / 2
    return left, top, left + crop_w, top + crop_h


def _size_field(size: Any, name: str) -> float | None:
    """A field of an image processor's size (a dict, or transformers 5's `SizeDict`), None when it has none."""
    value = size.get(name) if isinstance(size, dict) else getattr(size, name, None)
    return float(value) if value else None


#: The longest side, in pixels, of the image the panels are drawn over (the caption is of the whole image): each word's
#: panel draws the image again, so a 25-megapixel photo at full size took 16-22 s and 2.2 GB for an 8-word caption.
DISPLAY_EDGE = 1024


def draw_explanation(
    image, explanation: Explanation, *, columns: int = 4, image_processor=None, display_edge: int = DISPLAY_EDGE
):
    """The image with the caption, then one panel per generated word with where it attended laid over the image:
    a heatmap over the patch grid (I-Tuning), or the regions' boxes weighted by its attention (XGPT: grid cells as
    filled cells, object or detector boxes as rectangles, stronger attention more opaque); the CLS share, and XGPT's
    share on the image rather than the caption so far, in each panel's title. Positions without boxes get a note.

    Args:
        image: The image that was captioned (a path, PIL image or array).
        explanation: What `explain_caption` returned for it.
        columns: Panels per row.
        image_processor: The processor's image processor, to place the grid or boxes on the part of the image it saw
            (default: the whole image; a detector's regions are always placed on the whole image).
        display_edge: The longest side of the image as drawn: a larger one is drawn over a smaller copy.

    Returns:
        A `matplotlib.figure.Figure` (no GUI backend involved); `save_explanation` writes it as a PNG.
    """
    from matplotlib.figure import Figure

    from .models._shared.images import open_image

    shown = open_image(image)
    if max(shown.size) > display_edge:  # boxes and heatmaps are placed in proportion: the same on a smaller copy
        shown = shown.copy()
        shown.thumbnail((display_edge, display_edge))
    picture = np.asarray(shown)
    height, width = picture.shape[:2]
    whole = explanation.source == "regions" or image_processor is None
    frame = (0.0, 0.0, float(width), float(height)) if whole else visible_region((width, height), image_processor)
    panels = len(explanation.tokens) + 1
    rows = -(-panels // columns)
    figure = Figure(figsize=(3 * min(columns, panels), 3.2 * rows))
    top_value = _top_value(explanation)
    for index in range(panels):
        axes = figure.add_subplot(rows, min(columns, panels), index + 1)
        axes.imshow(picture)
        axes.set_axis_off()
        if index == 0:
            axes.set_title(_wrap(explanation.caption), fontsize=9)
            continue
        word = index - 1
        if explanation.boxes is not None:
            _draw_boxes(axes, explanation, word, frame, top_value)
        elif explanation.heatmaps is not None:
            left, top, right, bottom = frame
            axes.imshow(
                explanation.heatmaps[word],
                extent=(left, right, bottom, top),
                cmap="jet",
                alpha=0.5,
                vmin=0.0,
                vmax=top_value,
                interpolation="bilinear",
            )
        else:
            note = _wrap(explanation.note or "nothing to place in the image", 30)
            axes.text(0.5, 0.5, note, transform=axes.transAxes, ha="center", va="center", fontsize=7, wrap=True)
        axes.set_xlim(0, width)
        axes.set_ylim(height, 0)
        axes.set_title(_panel_title(explanation, word), fontsize=9)
    figure.suptitle(_figure_title(explanation), fontsize=8)
    figure.tight_layout()
    return figure


def _top_value(explanation: Explanation) -> float:
    """The largest weight drawn (the top of the colour scale; CLS left out, as it is not drawn in the image)."""
    values = explanation.region_attention if explanation.boxes is not None else explanation.heatmaps
    top = float(values.max()) if values is not None and values.size else 0.0
    return top if top > 0 else 1.0


def _draw_boxes(axes, explanation: Explanation, word: int, frame, top_value: float) -> None:
    """Word `word`'s attention as the regions' boxes: grid cells filled, other boxes outlined (and lightly filled),
    colour and opacity by weight, the strongest drawn last (on top)."""
    from matplotlib import colormaps
    from matplotlib.patches import Rectangle

    colour = colormaps["jet"]
    left, top, right, bottom = frame
    frame_width, frame_height = right - left, bottom - top
    weights = explanation.region_attention[word] / top_value
    for index in np.argsort(weights, kind="stable"):
        x1, y1, x2, y2 = (float(v) for v in explanation.boxes[index])
        corner = (left + x1 * frame_width, top + y1 * frame_height)
        size = ((x2 - x1) * frame_width, (y2 - y1) * frame_height)
        value = float(np.clip(weights[index], 0.0, 1.0))
        if explanation.source == "grid":
            axes.add_patch(
                Rectangle(
                    corner, *size, facecolor=colour(value), edgecolor="white", linewidth=0.3, alpha=0.1 + 0.6 * value
                )
            )
            continue
        axes.add_patch(Rectangle(corner, *size, facecolor=colour(value), edgecolor="none", alpha=0.3 * value))
        axes.add_patch(
            Rectangle(
                corner, *size, fill=False, edgecolor=colour(value), linewidth=0.5 + 2.5 * value, alpha=0.3 + 0.7 * value
            )
        )


def _panel_title(explanation: Explanation, word: int) -> str:
    shares = [] if explanation.source == "regions" else [f"CLS {explanation.cls_attention[word]:.0%}"]
    share = explanation.memory_share
    if share is not None and not np.allclose(share, 1.0):
        shares.append(f"image {share[word]:.0%}")
    return f"{explanation.tokens[word]}  ({', '.join(shares)})" if shares else explanation.tokens[word]


def _figure_title(explanation: Explanation) -> str:
    where = "" if explanation.source == "patches" else f" over {REGION_KINDS.get(explanation.source, 'regions')}"
    return f"{explanation.family} attention{where}, layers {explanation.layers}, heads {explanation.heads}"


def save_explanation(
    image, explanation: Explanation, path, *, columns: int = 4, image_processor=None, display_edge: int = DISPLAY_EDGE
):
    """Draw the explanation (`draw_explanation`) and write it to `path` as a PNG; returns the path.

    Args:
        image: The image that was captioned.
        explanation: What `explain_caption` returned for it.
        path: Where to write the PNG.
        columns: Panels per row.
        image_processor: See `draw_explanation`.
        display_edge: See `draw_explanation`.
    """
    from pathlib import Path

    figure = draw_explanation(
        image, explanation, columns=columns, image_processor=image_processor, display_edge=display_edge
    )
    path = Path(path)
    figure.savefig(path, format="png", dpi=100)
    return path


def _wrap(text: str, width: int = 40) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width)) or "(empty caption)"

"""Pre-training a small frozen vision tower on the synthetic world, so that the demo's tower has learned something,
as the paper's frozen CLIP has (`itune pretrain-vision`; `itune demo` uses it by default).

The objective is **attribute prediction** (the cheapest strong signal: the world generator knows every scene
exactly). Images are rendered in memory from `itune_hf.data.synthetic` with a world seed of their own (by default
not the demo's: the tower never sees the demo's test images), and the tower learns, through small heads that are
dropped afterwards:

* from its pooled output (CLS after the final layer norm, as CLIP's image embedding; a convolutional tower's pooled
  vector): the background, the layout (single, row, column), the object count, and each object's shape and colour
  in reading order (three slots, "none" where a scene has fewer objects);
* from each patch token of its last hidden states (what I-Tuning's modules attend to; a convolutional tower's
  feature-map cells): the colour drawn at the patch's centre (background included), and, on the patches an object
  covers (an eighth of their pixels at least), the shape covering most of it. Trained over every patch, the shape
  head mostly learns "background" (most patches are) and stays near chance on the object patches
  (benchmarks/RESULTS.md, the tower study).

Layout of a tower directory::

    tower/                  the trained tower: a transformers vision model (config.json, model.safetensors) and
                            its image processor (preprocessor_config.json); load it with `load_vision_tower`
    report.json             held-out accuracy of every head next to its chance rate (the majority class), seconds
    fingerprint.json        what produced it (the world generator's version, seed and size; the tower's config
                            and initial seed; the pre-training settings) and the SHA-256 of every file; written last

`pretrain_vision_tower` reuses a directory whose fingerprint matches and whose files are intact, and trains again
otherwise (a changed setting, a damaged or half-written file: the reason is printed); every file is written
atomically (a temporary name, then a rename), the fingerprint last.

A backbone reference `itune:pretrain-vision/<preset>` (`TOWER_REFERENCE`, the `hub_id` of
`presets/backbones/demo-resnet-pretrained.json`, xgpt-demo-resnet's tower) names that preset's tower pre-trained
with the default settings: loading it pre-trains it once, into the shared cache (`default_tower_dir`, where `itune
pretrain-vision --preset <preset>` writes it too), and reuses it from then on (`resolve_tower_reference`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InputError
from ..utils.files import atomic_write_json, sha256_of_file
from ..utils.output_dirs import claim_output_dir

if TYPE_CHECKING:
    import numpy as np
    import torch

#: Bumped whenever the objective or the training code changes what a given fingerprint produces.
PRETRAINING_VERSION = 2  # 2: the patch shape head learns (weighted, HEAD_WEIGHTS) and is scored on object patches
OBJECTIVE = "attributes"
FINGERPRINT_NAME = "fingerprint.json"
REPORT_NAME = "report.json"
TOWER_DIR = "tower"
SLOTS = 3  # objects per scene at most (reading order)
LAYOUTS = ("single", "row", "column")
MAX_DEFAULT_IMAGES = 4096
#: Loss weight per head (1 for the others). The shape under each object patch is the hardest target and the one
#: I-Tuning's modules read; summed with ten other heads at weight 1 it stays near chance on the object patches, and
#: weighted 10 it learns them (benchmarks/RESULTS.md, "The demo's vision tower").
HEAD_WEIGHTS = {"patch_shape": 10.0}
_IGNORED = {"patch_shape": 0}  # label left out of a head's loss (patches no object covers)
#: Backbone reference of a preset's tower pre-trained here with the default settings: `TOWER_REFERENCE + preset`.
TOWER_REFERENCE = "itune:pretrain-vision/"


@dataclass(frozen=True)
class VisionPretrainingSettings:
    """How the tower is pre-trained (all part of the fingerprint).

    Args:
        steps: Optimizer steps.
        batch_size: Images per step.
        learning_rate: Peak AdamW learning rate (linear warm-up over a tenth of the steps, then cosine).
        weight_decay: AdamW weight decay.
        num_images: Distinct training images rendered from the world (cycled through, reshuffled every pass);
            default: as many as the run sees, at most 4,096.
        eval_images: Held-out images (the next indices of the same world) for the accuracies of `report.json`.
        world_seed: Seed of the pre-training world; `itune demo` uses its own `--seed` + 1 (1 by default), so that
            the tower never sees the demo's test images.
        image_size: Side of the rendered images in pixels (the image processor resizes them to the tower's).
        seed: Seed of the heads' initialisation and of the batch order (the tower starts from its preset's
            seeded random initialisation).
    """

    steps: int = 150
    batch_size: int = 64
    learning_rate: float = 3e-3
    weight_decay: float = 0.01
    num_images: int | None = None
    eval_images: int = 512
    world_seed: int = 1
    image_size: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        from ..data.synthetic import MIN_IMAGE_SIZE

        if self.num_images is None and isinstance(self.steps, int) and isinstance(self.batch_size, int):
            object.__setattr__(self, "num_images", min(MAX_DEFAULT_IMAGES, self.steps * self.batch_size))
        for name in ("steps", "batch_size", "num_images", "eval_images"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer; got {getattr(self, name)!r}")
        if not self.learning_rate > 0 or self.weight_decay < 0:
            raise ValueError(
                f"learning_rate must be > 0 and weight_decay >= 0; got {self.learning_rate}, {self.weight_decay}"
            )
        if self.image_size < MIN_IMAGE_SIZE:
            raise ValueError(f"image_size must be at least {MIN_IMAGE_SIZE} pixels; got {self.image_size}")


@dataclass
class PretrainedTower:
    """A pre-trained vision tower on disk.

    Attributes:
        directory: The tower directory (`tower/` inside it is what `--vision-model` and `load_vision_tower` take).
        reused: Whether it was found intact with the same fingerprint (no training this time).
        report: `report.json`: held-out accuracy and chance rate per head, steps, seconds.
    """

    directory: Path
    reused: bool
    report: dict[str, Any]

    @property
    def tower_dir(self) -> Path:
        """The transformers checkpoint of the tower (and its image processor)."""
        return self.directory / TOWER_DIR

    def load(self):
        """The tower (a frozen transformers vision model, in eval mode)."""
        from ..models._shared.backbones import load_vision_tower

        return load_vision_tower(str(self.tower_dir)).eval().requires_grad_(False)

    def describe(self) -> str:
        """One line: where the tower is, whether it was reused, and its held-out accuracy against chance."""
        report = self.report
        action = "reused (same fingerprint)" if self.reused else f"pre-trained in {report['seconds']:.0f}s"
        return (
            f"vision tower {action}: {self.tower_dir}; held-out attribute accuracy {report['mean_accuracy']:.3f} "
            f"(chance {report['mean_chance']:.3f}) over {len(report['heads'])} heads"
        )


# ----------------------------------------------------------------------------------------------------------------
# The world's images and their labels
# ----------------------------------------------------------------------------------------------------------------
def _heads() -> dict[str, int]:
    """Every head and its number of classes (global heads first, then the per-patch ones)."""
    from ..data.synthetic import BACKGROUNDS, COLORS, PALETTE, SHAPES

    heads = {"background": len(BACKGROUNDS), "layout": len(LAYOUTS), "count": SLOTS}
    for slot in range(SLOTS):
        heads[f"shape_{slot}"] = len(SHAPES) + 1  # 0: no object in this slot
        heads[f"color_{slot}"] = len(COLORS) + 1
    heads["patch_color"] = len(PALETTE)  # the palette: backgrounds, then object colours
    heads["patch_shape"] = len(SHAPES) + 1  # 0: background
    return heads


PATCH_HEADS = ("patch_color", "patch_shape")


def render_examples(seed: int, start: int, count: int, image_size: int, grid: int) -> tuple[list, dict]:
    """Images `start .. start + count - 1` of the synthetic world with `seed`, and their labels.

    Args:
        seed: World seed.
        start: First image index.
        count: Number of images.
        image_size: Side in pixels.
        grid: Patches per side of the tower. A patch's colour label is the colour at its centre (background
            included); its shape label is the shape covering most of its pixels, if that covers at least an eighth
            of them, else 0 (no object: left out of the shape head's loss and accuracy).

    Returns:
        `(images, labels)`: PIL images, and per head a tensor `(count,)` (global heads) or `(count, grid * grid)`.
    """
    import numpy as np
    import torch
    from PIL import Image

    from ..data.synthetic import COLORS, PALETTE, PALETTE_INDEX, SHAPES, scene_of, shape_mask

    palette = np.asarray(PALETTE, dtype=np.uint8)
    centres = ((np.arange(grid) + 0.5) * image_size / grid).astype(int)
    images, labels = [], {name: [] for name in _heads()}
    for index in range(start, start + count):
        scene = scene_of(seed, index)
        canvas = np.full((image_size, image_size), PALETTE_INDEX[scene.background], dtype=np.uint8)
        shapes = np.zeros((image_size, image_size), dtype=np.int64)
        for obj in scene.objects:
            mask = shape_mask(obj.shape, obj.cx * image_size, obj.cy * image_size, obj.size * image_size, image_size)
            canvas[mask] = PALETTE_INDEX[obj.color]
            shapes[mask] = SHAPES.index(obj.shape) + 1
        images.append(Image.fromarray(palette[canvas], "RGB"))
        labels["background"].append(PALETTE_INDEX[scene.background])
        labels["layout"].append(LAYOUTS.index(scene.layout))
        labels["count"].append(len(scene.objects) - 1)
        for slot in range(SLOTS):
            obj = scene.objects[slot] if slot < len(scene.objects) else None
            labels[f"shape_{slot}"].append(SHAPES.index(obj.shape) + 1 if obj else 0)
            labels[f"color_{slot}"].append(list(COLORS).index(obj.color) + 1 if obj else 0)
        labels["patch_color"].append(canvas[np.ix_(centres, centres)].reshape(-1).astype(np.int64))
        labels["patch_shape"].append(_patch_shapes(shapes, grid))
    return images, {name: torch.as_tensor(np.asarray(values)) for name, values in labels.items()}


def _patch_shapes(shapes: np.ndarray, grid: int) -> np.ndarray:
    """Per patch (row-major), the shape (1-based) covering most of its pixels if it covers an eighth of them, else 0.

    Args:
        shapes: `(size, size)` drawn shape per pixel (0: background).
        grid: Patches per side.
    """
    import numpy as np

    from ..data.synthetic import SHAPES

    side = shapes.shape[0] // grid
    cells = shapes[: side * grid, : side * grid].reshape(grid, side, grid, side).transpose(0, 2, 1, 3)
    cells = cells.reshape(grid * grid, side * side)
    cover = np.stack([(cells == k).sum(1) for k in range(1, len(SHAPES) + 1)], axis=1)
    best = cover.argmax(1)
    return np.where(cover[np.arange(len(best)), best] * 8 >= side * side, best + 1, 0).astype(np.int64)


# ----------------------------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------------------------
def attribute_heads(width: int) -> torch.nn.ModuleDict:
    """Linear heads over the tower's pooled output (global attributes) and its normalised patch tokens (per-patch
    ones), one per entry of `_heads()`, and the patch tokens' layer norm (`"norm"`); dropped after pre-training."""
    import torch

    heads = {name: torch.nn.Linear(width, classes) for name, classes in _heads().items()}
    return torch.nn.ModuleDict({"norm": torch.nn.LayerNorm(width), **heads})


def _predict(heads: torch.nn.ModuleDict, pooled: torch.Tensor, patches: torch.Tensor) -> dict[str, torch.Tensor]:
    patches = heads["norm"](patches)
    return {name: heads[name](patches if name in PATCH_HEADS else pooled) for name in _heads()}


def _tower_outputs(tower: torch.nn.Module, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The pooled output and the patch tokens: a ViT's last hidden states without the CLS token, or a convolutional
    network's feature-map cells (row-major, as I-Tuning reads them) with its pooled vector."""
    from ..models._shared.backbones import as_vision_tokens

    output = tower(pixel_values=pixels)
    states = output.last_hidden_state
    if states.dim() == 4:
        return output.pooler_output.flatten(1), as_vision_tokens(states)
    return output.pooler_output, states[:, 1:]


def _grid_side(tower: torch.nn.Module, image_processor: Any, image_size: int) -> int:
    """Patches (or feature-map cells) per side of the tower's grid, for images of `image_size` pixels as the image
    processor hands them to it."""
    import math

    import torch
    from PIL import Image

    blank = _pixels(image_processor, [Image.new("RGB", (image_size, image_size))])
    training = tower.training
    with torch.no_grad():  # in eval mode: a batch-norm tower's running statistics must not see this blank image
        _, patches = _tower_outputs(tower.eval(), blank)
    tower.train(training)
    return math.isqrt(patches.shape[1])


def _loss(logits: dict[str, torch.Tensor], labels: dict[str, torch.Tensor]) -> torch.Tensor:
    import torch

    losses = [  # the patch shape head learns on object patches only: background is the colour head's
        HEAD_WEIGHTS.get(name, 1.0)
        * torch.nn.functional.cross_entropy(
            value.reshape(-1, value.shape[-1]), labels[name].reshape(-1), ignore_index=_IGNORED.get(name, -100)
        )
        for name, value in logits.items()
    ]
    return torch.stack(losses).sum()


def _pixels(image_processor: Any, images: list) -> torch.Tensor:
    return image_processor(images, return_tensors="pt")["pixel_values"]


def train_tower(tower, image_processor, settings: VisionPretrainingSettings, *, progress: bool = False) -> dict:
    """Pre-train `tower` in place on the synthetic world's attributes; returns the held-out report.

    Args:
        tower: A transformers vision model with `pooler_output` and `last_hidden_state` (e.g. CLIP's).
        image_processor: Its image processor.
        settings: How to pre-train.
        progress: Print the loss every tenth of the run.
    """
    import torch

    started = time.time()
    grid = _grid_side(tower, image_processor, settings.image_size)
    images, labels = render_examples(settings.world_seed, 0, settings.num_images, settings.image_size, grid)
    pixels = _pixels(image_processor, images)
    threads = torch.get_num_threads()
    # at most half the CPUs: a small tower's operations gain little from more threads, and on a busy machine
    # threads waiting for each other lose a lot: a step on all the cores can take several times as long as on one
    torch.set_num_threads(max(1, min(threads, (os.cpu_count() or 2) // 2)))
    try:
        heads = _train(tower, pixels, labels, settings, progress)
    finally:
        torch.set_num_threads(threads)
    report = evaluate_heads(tower, heads, image_processor, settings, grid)
    report["seconds"] = round(time.time() - started, 1)
    return report


def _train(tower, pixels: torch.Tensor, labels: dict, settings: VisionPretrainingSettings, progress: bool):
    """The optimisation loop (seeded, without touching the global RNG); returns the trained heads."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(settings.seed)
        from ..models._shared.backbones import vision_width

        heads = attribute_heads(vision_width(tower.config))
        order = torch.Generator().manual_seed(settings.seed)
        tower.train().requires_grad_(True)
        parameters = [*tower.parameters(), *heads.parameters()]
        optimizer = torch.optim.AdamW(parameters, lr=settings.learning_rate, weight_decay=settings.weight_decay)
        schedule = _schedule(optimizer, settings.steps)
        batches = _batches(settings.num_images, settings.batch_size, order)
        for step in range(settings.steps):
            rows = next(batches)
            logits = _predict(heads, *_tower_outputs(tower, pixels[rows]))
            loss = _loss(logits, {k: v[rows] for k, v in labels.items()})
            if not torch.isfinite(loss):
                raise InputError(
                    f"vision pre-training step {step + 1}: the loss is {loss.item()} (the tower diverged); nothing "
                    f"was saved: lower --learning-rate ({settings.learning_rate}) and run again"
                )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(parameters, 1.0)
            optimizer.step()
            schedule.step()
            if progress and (step + 1) % max(1, settings.steps // 10) == 0:
                print(f"      vision pre-training step {step + 1}/{settings.steps}: loss {loss.item():.3f}", flush=True)
    tower.eval().requires_grad_(False)
    return heads


def _schedule(optimizer: torch.optim.Optimizer, steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over a tenth of the steps, then cosine decay to zero."""
    import math

    import torch

    warmup = max(1, steps // 10)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _batches(size: int, batch_size: int, generator: torch.Generator):
    """Endless batches of row indices: passes over `range(size)`, each in a new random order."""
    import torch

    while True:
        order = torch.randperm(size, generator=generator)
        for start in range(0, size - min(batch_size, size) + 1, min(batch_size, size)):
            yield order[start : start + batch_size]


def evaluate_heads(tower, heads: torch.nn.ModuleDict, image_processor, settings: VisionPretrainingSettings, grid: int):
    """Held-out accuracy of every head next to its chance rate (always answering the held-out majority class).

    Returns:
        `{"heads": {name: {"accuracy", "chance"}}, "mean_accuracy", "mean_chance", "steps", "eval_images"}`; the
        patch shape head is scored on the patches an object covers (what tells whether the tower sees shapes).
    """
    import torch

    images, labels = render_examples(
        settings.world_seed, settings.num_images, settings.eval_images, settings.image_size, grid
    )
    with torch.no_grad():
        logits = _predict(heads, *_tower_outputs(tower, _pixels(image_processor, images)))
    results = {}
    for name, value in logits.items():
        truth, predicted = labels[name].reshape(-1), value.reshape(-1, value.shape[-1]).argmax(-1)
        if name == "patch_shape":
            truth, predicted = truth[truth > 0], predicted[truth > 0]
        accuracy = (predicted == truth).float().mean().item()
        chance = truth.bincount().max().item() / truth.numel()
        results[name] = {"accuracy": round(accuracy, 4), "chance": round(chance, 4)}
    return {
        "objective": OBJECTIVE,
        "heads": results,
        "mean_accuracy": round(sum(r["accuracy"] for r in results.values()) / len(results), 4),
        "mean_chance": round(sum(r["chance"] for r in results.values()) / len(results), 4),
        "steps": settings.steps,
        "eval_images": settings.eval_images,
    }


# ----------------------------------------------------------------------------------------------------------------
# The cache: a fingerprinted tower directory
# ----------------------------------------------------------------------------------------------------------------
def vision_backbone(preset: str):
    """The vision backbone of `preset` (a `presets.Backbone`), refused when it cannot be pre-trained here.

    Raises:
        KeyError: the preset is unknown (naming the known ones).
        ValueError: the preset's vision tower has real weights already, or is not a ViT with a stored config.
    """
    from ..presets import get_preset

    backbone = get_preset(preset).vision
    if backbone.hub_id is not None:
        raise ValueError(
            f"preset {preset!r}: its vision tower already has pretrained weights ({backbone.hub_id}); pre-training "
            "here is for the small random towers of the demo presets (such as itune-demo's demo-vit-tiny)"
        )
    config = backbone.config
    if not ("hidden_size" in config or "hidden_sizes" in config):
        raise ValueError(
            f"preset {preset!r}: its vision tower {backbone.name!r} has no stored config with its width (hidden_size, "
            "or hidden_sizes for a convolutional network); pre-training needs one, such as itune-demo's demo-vit-tiny"
        )
    return backbone


def tower_fingerprint(preset: str, settings: VisionPretrainingSettings) -> dict[str, Any]:
    """What a pre-trained tower depends on: the objective, the world generator's version, the tower's config, its
    initial seed and image processor, and the settings (the world's seed and size among them).

    Args:
        preset: The preset whose vision tower is pre-trained.
        settings: How it is pre-trained.
    """
    from ..data.synthetic import DRAW_VERSION  # the images and their scenes (not dataset.json's other fields)

    backbone = vision_backbone(preset)
    return {
        "kind": "itune_hf pre-trained vision tower",
        "version": PRETRAINING_VERSION,
        "objective": OBJECTIVE,
        "world": {"generator": "itune_hf.data.synthetic", "version": DRAW_VERSION},
        "tower": {
            "backbone": backbone.name,
            "config": backbone.config,
            "init_seed": backbone.init_seed,
            "image_processor": backbone.image_processor,
        },
        "settings": dataclasses.asdict(settings),
    }


def default_tower_dir(preset: str, settings: VisionPretrainingSettings) -> Path:
    """The shared cache's directory for this tower: `<itune cache>/vision-towers/<backbone>-<hash of its
    fingerprint>` (`$ITUNE_CACHE`, else `~/.cache/itune_hf`: see `itune_hf.models.packaged_backbones.cache_dir`)."""
    from ..models.packaged_backbones import cache_dir

    identity = json.dumps(tower_fingerprint(preset, settings), sort_keys=True)
    digest = hashlib.sha256(identity.encode()).hexdigest()[:12]
    return cache_dir() / "vision-towers" / f"{vision_backbone(preset).name}-{digest}"


def _cache_problem(directory: Path, identity: dict[str, Any]) -> str | None:
    """Why the tower in `directory` cannot be reused (None: it can): missing, another fingerprint, damaged files."""
    path = directory / FINGERPRINT_NAME
    if not path.is_file():
        if not directory.exists() or not any(directory.iterdir()):
            return None  # nothing there yet
        return "it has no fingerprint.json (an earlier pre-training did not finish)"
    try:
        recorded = json.loads(path.read_text())
        same, files = recorded["identity"] == identity, recorded["files"]
    except (ValueError, KeyError, TypeError) as error:
        return f"its fingerprint.json is damaged ({error})"
    if not same:
        changed = sorted(k for k in identity if recorded["identity"].get(k) != identity[k])
        settings = recorded["identity"].get("settings") or {}
        changed += [f"settings.{k}" for k in identity["settings"] if settings.get(k) != identity["settings"][k]]
        return f"it was pre-trained differently ({', '.join(c for c in changed if c != 'settings')} changed)"
    for name, digest in files.items():
        if not (directory / name).is_file():
            return f"{name} is missing"
        if sha256_of_file(directory / name) != digest:
            return f"{name} is damaged (its SHA-256 differs from the fingerprint's)"
    return None


def pretrain_vision_tower(
    preset: str = "itune-demo",
    directory: str | os.PathLike | None = None,
    settings: VisionPretrainingSettings | None = None,
    *,
    force: bool = False,
    progress: bool = False,
    overwrite: bool = False,
) -> PretrainedTower:
    """The preset's vision tower pre-trained on the synthetic world (attribute prediction), cached on first use.

    Reuses `directory` when its fingerprint matches and its files are intact (nothing is trained); pre-trains again
    when a setting differs or a file is damaged or missing, printing why to stderr.

    Args:
        preset: The preset whose vision tower is pre-trained (from its seeded random initialisation).
        directory: Where the tower goes; default: `default_tower_dir(preset, settings)` in the shared cache.
        settings: How to pre-train (default: `VisionPretrainingSettings()`).
        force: Pre-train even if an intact tower with the same fingerprint is there.
        progress: Print the loss while training.
        overwrite: Pre-train into a directory holding files a pre-training did not write (they are removed, and
            named); without it such a directory is refused.

    Returns:
        A `PretrainedTower` (`tower_dir` is what `itune train --vision-model` takes).

    Raises:
        KeyError: unknown preset.
        ValueError: a preset whose tower cannot be pre-trained, or a bad setting.
        NotADirectoryError: `directory` is a file.
        FileExistsError: `directory` holds files a pre-training did not write (without `overwrite`), or another
            command is writing it.
    """
    settings = settings or VisionPretrainingSettings()
    identity = tower_fingerprint(preset, settings)
    directory = Path(directory) if directory is not None else default_tower_dir(preset, settings)
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(f"{directory}: not a directory; pass another directory for the vision tower")
    problem = _cache_problem(directory, identity)
    if not force and problem is None and (directory / FINGERPRINT_NAME).is_file():
        return PretrainedTower(directory, reused=True, report=json.loads((directory / REPORT_NAME).read_text()))
    lock = claim_output_dir(
        directory, command="itune pretrain-vision", overwrite=overwrite,
        is_previous_output=lambda path: (path / FINGERPRINT_NAME).is_file(),
    )  # fmt: skip
    try:
        if problem is not None:
            print(f"vision tower cache {directory}: {problem}; pre-training it again", file=sys.stderr)
        _clear(directory)
        report = _pretrain_into(directory, preset, settings, progress)
        files = [TOWER_DIR + "/" + p.name for p in sorted((directory / TOWER_DIR).iterdir())] + [REPORT_NAME]
        atomic_write_json(
            directory / FINGERPRINT_NAME,
            {"identity": identity, "files": {name: sha256_of_file(directory / name) for name in files}},
        )
    finally:
        lock.release()
    return PretrainedTower(directory, reused=False, report=report)


def resolve_tower_reference(name_or_path: str) -> str:
    """The tower directory of a reference `itune:pretrain-vision/<preset>` (pre-trained on first use, with the
    default `VisionPretrainingSettings`, in the shared cache); anything else unchanged.

    Args:
        name_or_path: A backbone reference (a preset's `hub_id`, a config's `_name_or_path`).

    Raises:
        KeyError: the reference names an unknown preset.
    """
    if not name_or_path.startswith(TOWER_REFERENCE):
        return name_or_path
    preset, settings = name_or_path[len(TOWER_REFERENCE) :], VisionPretrainingSettings()
    directory = default_tower_dir(preset, settings)
    if not (directory / FINGERPRINT_NAME).is_file() or _cache_problem(directory, tower_fingerprint(preset, settings)):
        print(
            f"{name_or_path}: pre-training {preset}'s vision tower ({settings.steps} steps, once; cached in "
            f"{directory})", file=sys.stderr, flush=True,
        )  # fmt: skip
    return str(pretrain_vision_tower(preset, directory, settings).tower_dir)


def _clear(directory: Path) -> None:
    """Remove what a tower directory holds (the fingerprint first, so that a kill midway leaves it unusable)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / FINGERPRINT_NAME).unlink(missing_ok=True)
    shutil.rmtree(directory / TOWER_DIR, ignore_errors=True)
    (directory / REPORT_NAME).unlink(missing_ok=True)


def _pretrain_into(directory: Path, preset: str, settings: VisionPretrainingSettings, progress: bool) -> dict:
    """Pre-train the preset's tower and write `tower/` (atomically: a temporary folder renamed) and `report.json`."""
    from ..presets import build_image_processor

    backbone = vision_backbone(preset)
    tower = backbone.load(pretrained=False, vision=True)
    image_processor = build_image_processor(preset)  # the LM's tokenizer (SmolLM2's: converted) is not needed
    report = {"preset": preset, "backbone": backbone.name, **train_tower(tower, image_processor, settings,
                                                                          progress=progress)}  # fmt: skip
    staging = directory / (TOWER_DIR + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    tower.save_pretrained(staging)
    image_processor.save_pretrained(staging)
    os.replace(staging, directory / TOWER_DIR)
    atomic_write_json(directory / REPORT_NAME, report)
    return report


__all__ = [
    "TOWER_REFERENCE", "PretrainedTower", "VisionPretrainingSettings", "default_tower_dir", "pretrain_vision_tower",
    "render_examples", "resolve_tower_reference", "tower_fingerprint", "train_tower",
]  # fmt: skip

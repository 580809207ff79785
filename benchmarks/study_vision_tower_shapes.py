"""How fast the demo's small vision tower learns the synthetic world's shapes: a learning curve of the attribute
pre-training (`itune_hf.vision.pretraining`) with held-out accuracies every `--eval-every` steps.

Issue 27 asks for a tower whose per-object shape heads (first, second, third object's shape, from the pooled output)
reach 0.9 held out. This study measures where a run of a given length gets, with two levers the package does not
use by default:

* `--position-lr-scale S`: the position and class embeddings learn at S times the learning rate, without weight
  decay (they start at a standard deviation of 0.02, far below the patch content's; at the base rate the tower needs
  hundreds of steps before it can tell where anything is);
* `--patch-target object`: each patch's shape label is the shape covering most of its pixels (at least `--min-cover`
  of them; else none), and only object patches count in its loss, instead of the shape drawn at the
  patch's centre over every patch (most of which are background).

and two that ask whether the architecture or the objective holds shapes back:

* `--tower resnet` / `--tower swin`: instead of the demo preset's CLIP ViT (2 layers, width 128, 8x8 patches), a
  randomly initialised transformers ResNet (a 7x7 stride-2 stem and max-pool, then two basic stages of width 64 and
  128: an 8x8 grid of 128-wide features) or Swin (4x4 patches, two stages of depth 2, windows of 4: an 8x8 grid of
  128-wide tokens), read as the same grid of 64 tokens plus a pooled vector;
* `--heads NAMES`: train only these heads (comma-separated names of `vision_pretraining._heads()`); every head is
  still evaluated (the untrained ones sit near chance).

Example (the runs of benchmarks/RESULTS.md, "The demo's vision tower and shapes")::

    python benchmarks/study_vision_tower_shapes.py --steps 2000 --batch-size 32 --learning-rate 1e-3 \
        --position-lr-scale 30 --patch-target object --warmup-fraction 0.05 --eval-every 250
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from itune_hf.data.synthetic import SHAPES, scene_of, shape_mask  # noqa: E402
from itune_hf.presets import build_processor  # noqa: E402
from itune_hf.vision import pretraining as vp  # noqa: E402

PRESET = "itune-demo"
TOWERS = ("clip", "resnet", "swin")
SHOWN = ("shape_0", "shape_1", "shape_2", "patch_shape", "count", "layout", "color_0")


def object_patch_shapes(seed: int, start: int, count: int, image_size: int, grid: int, min_cover: int) -> torch.Tensor:
    """Per patch, the shape (1-based; 0: none) that covers most of its pixels, if it covers at least `min_cover`.

    Args:
        seed: World seed.
        start: First image index.
        count: Number of images.
        image_size: Side in pixels (a multiple of `grid`).
        grid: Patches per side.
        min_cover: Fewest object pixels for a patch to be labelled with that object's shape.

    Returns:
        A `(count, grid * grid)` tensor, patches in row-major order (the tower's).
    """
    side = image_size // grid
    labels = []
    for index in range(start, start + count):
        cover = np.zeros((len(SHAPES) + 1, grid, grid), dtype=np.int64)
        for obj in scene_of(seed, index).objects:
            mask = shape_mask(obj.shape, obj.cx * image_size, obj.cy * image_size, obj.size * image_size, image_size)
            cover[SHAPES.index(obj.shape) + 1] += mask.reshape(grid, side, grid, side).sum((1, 3))
        best = cover[1:].argmax(0) + 1
        labels.append(np.where(cover[1:].max(0) >= min_cover, best, 0).reshape(-1))
    return torch.as_tensor(np.asarray(labels))


def examples(args: argparse.Namespace, processor, start: int, count: int) -> tuple[torch.Tensor, dict]:
    """Pixels and labels of images `start .. start + count - 1` of the pre-training world (seed 1).

    Args:
        args: The study's arguments (`--patch-target`, `--min-cover`).
        processor: The tower's image processor.
        start: First image index.
        count: Number of images.
    """
    images, labels = vp.render_examples(1, start, count, 64, 8)
    if args.patch_target == "object":
        labels["patch_shape"] = object_patch_shapes(1, start, count, 64, 8, args.min_cover)
    return vp._pixels(processor, images), labels


def tower_of(name: str) -> torch.nn.Module:
    """The randomly initialised tower to pre-train (seeded by the caller).

    Args:
        name: One of `TOWERS`: the demo preset's CLIP ViT, or a ResNet or Swin giving the same 8x8 grid of 128-wide
            features at 64x64 pixels.
    """
    if name == "clip":
        return vp.vision_backbone(PRESET).load(pretrained=False, vision=True)
    if name == "resnet":
        from transformers import ResNetConfig, ResNetModel

        return ResNetModel(ResNetConfig(embedding_size=32, hidden_sizes=[64, 128], depths=[1, 1], layer_type="basic"))
    from transformers import SwinConfig, SwinModel

    return SwinModel(SwinConfig(image_size=64, patch_size=4, embed_dim=64, depths=[2, 2], num_heads=[2, 4],
                                window_size=4))  # fmt: skip


def outputs_of(tower: torch.nn.Module, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The pooled vector and the 64 grid tokens of any tower of `tower_of` (CLIP's CLS token dropped, a ResNet's
    feature map flattened row-major).

    Args:
        tower: The tower.
        pixels: Pixel values.
    """
    if tower.config.model_type == "clip_vision_model":
        return vp._tower_outputs(tower, pixels)
    output = tower(pixel_values=pixels)
    states = output.last_hidden_state
    if states.dim() == 4:  # (batch, channels, height, width)
        return output.pooler_output.flatten(1), states.flatten(2).transpose(1, 2)
    return output.pooler_output, states


def optimizer_for(args: argparse.Namespace, tower, heads) -> torch.optim.AdamW:
    """AdamW over the tower and heads; the position and class embeddings at `--position-lr-scale` times the rate.

    Args:
        args: The study's arguments.
        tower: The vision tower.
        heads: The attribute heads.
    """
    embeddings = [p for n, p in tower.named_parameters() if "position_embedding" in n or "class_embedding" in n]
    ids = {id(p) for p in embeddings}
    rest = [p for p in [*tower.parameters(), *heads.parameters()] if id(p) not in ids]
    groups = [{"params": rest}, {"params": embeddings, "lr": args.learning_rate * args.position_lr_scale,
                                 "weight_decay": 0.0}]  # fmt: skip
    return torch.optim.AdamW(groups, lr=args.learning_rate, weight_decay=0.01)


def schedule_for(args: argparse.Namespace, optimizer) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over `--warmup-fraction` of the steps, then cosine decay to zero.

    Args:
        args: The study's arguments.
        optimizer: The optimizer.
    """
    warmup = max(1, int(args.steps * args.warmup_fraction))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, args.steps - warmup)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def loss_of(args: argparse.Namespace, logits: dict, labels: dict) -> torch.Tensor:
    """The heads' summed cross-entropy (object patches only for the object patch target).

    Args:
        args: The study's arguments.
        logits: Per head, the logits.
        labels: Per head, the labels of the batch.
    """
    total = torch.zeros(())
    trained = args.heads.split(",") if args.heads else list(logits)
    for name, value in ((name, logits[name]) for name in trained):
        ignore = 0 if args.patch_target == "object" and name == "patch_shape" else -100
        flat = value.reshape(-1, value.shape[-1])
        total = total + torch.nn.functional.cross_entropy(flat, labels[name].reshape(-1), ignore_index=ignore)
    return total


def accuracies(tower, heads, pixels: torch.Tensor, labels: dict) -> dict[str, float]:
    """Held-out accuracy per head (object patches only for `patch_shape`: background patches are the colour
    head's business, and counting them would hide whether shapes are seen).

    Args:
        tower: The vision tower.
        heads: The attribute heads.
        pixels: Held-out pixels.
        labels: Their labels.
    """
    tower.eval()
    with torch.no_grad():
        logits = vp._predict(heads, *outputs_of(tower, pixels))
    tower.train()
    result = {}
    for name, value in logits.items():
        truth = labels[name].reshape(-1)
        right = value.reshape(-1, value.shape[-1]).argmax(-1) == truth
        result[name] = (right[truth > 0] if name == "patch_shape" else right).float().mean().item()
    return result


def chances(labels: dict) -> dict[str, float]:
    """Per head, the held-out majority class's rate (object patches only for `patch_shape`).

    Args:
        labels: The held-out labels.
    """
    result = {}
    for name, value in labels.items():
        truth = value.reshape(-1)
        truth = truth[truth > 0] if name == "patch_shape" else truth
        result[name] = truth.bincount().max().item() / truth.numel()
    return result


def run(args: argparse.Namespace) -> list[dict]:
    """Pre-train the demo preset's tower as asked; returns one row per evaluation.

    Args:
        args: The study's arguments.
    """
    torch.set_num_threads(args.threads)
    started = time.time()
    processor = build_processor(PRESET).image_processor
    pixels, labels = examples(args, processor, 0, args.num_images)
    held_pixels, held_labels = examples(args, processor, args.num_images, args.eval_images)
    chance = chances(held_labels)
    print("chance: " + " ".join(f"{n}={chance[n]:.2f}" for n in SHOWN), flush=True)
    torch.manual_seed(0)
    tower = tower_of(args.tower).train().requires_grad_(True)
    heads = vp.attribute_heads(128)
    optimizer = optimizer_for(args, tower, heads)
    schedule = schedule_for(args, optimizer)
    batches = vp._batches(args.num_images, args.batch_size, torch.Generator().manual_seed(0))
    rows = []
    for step in range(1, args.steps + 1):
        batch = next(batches)
        logits = vp._predict(heads, *outputs_of(tower, pixels[batch]))
        loss = loss_of(args, logits, {k: v[batch] for k, v in labels.items()})
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([*tower.parameters(), *heads.parameters()], 1.0)
        optimizer.step()
        schedule.step()
        if step % args.eval_every == 0 or step == args.steps:
            accuracy = accuracies(tower, heads, held_pixels, held_labels)
            rows.append({"step": step, "seconds": round(time.time() - started, 1), "load": os.getloadavg()[0],
                         "accuracy": accuracy, "chance": chance})  # fmt: skip
            print(f"step {step}: " + " ".join(f"{n}={accuracy[n]:.2f}" for n in SHOWN)
                  + f" | {rows[-1]['seconds']:.0f} s, load {rows[-1]['load']:.2f}", flush=True)  # fmt: skip
    return rows


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The study's arguments.

    Args:
        argv: Command-line arguments (default: `sys.argv[1:]`).
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--position-lr-scale", type=float, default=1.0)
    parser.add_argument("--warmup-fraction", type=float, default=0.1)
    parser.add_argument("--patch-target", choices=("centre", "object"), default="centre")
    parser.add_argument("--min-cover", type=int, default=8, help="Object pixels (of 64) for an object patch.")
    parser.add_argument("--tower", choices=TOWERS, default="clip")
    parser.add_argument("--heads", default=None, help="Train only these heads (comma-separated; default: all).")
    parser.add_argument("--num-images", type=int, default=4096)
    parser.add_argument("--eval-images", type=int, default=256)
    parser.add_argument("--eval-every", type=int, default=250)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None, help="Write the evaluations here.")
    args = parser.parse_args(argv)
    unknown = set(args.heads.split(",")) - set(vp._heads()) if args.heads else set()
    if unknown:
        parser.error(f"--heads: unknown {sorted(unknown)}; the heads are {', '.join(vp._heads())}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the study and optionally write its rows as JSON.

    Args:
        argv: Command-line arguments.
    """
    args = parse(argv)
    rows = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps({"arguments": vars(args), "evaluations": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

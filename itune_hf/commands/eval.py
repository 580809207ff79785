"""`itune eval`: caption a split and score it with the coco-caption metrics (distributed under accelerate)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..metrics.registry import ALL_METRICS, SCENE_METRICS
from ..utils.files import atomic_write_json, atomic_write_text, without_nan

HELP = (
    f"Caption a dataset split and score it ({', '.join(ALL_METRICS)}, and {', '.join(SCENE_METRICS)} where the "
    "data records what each image shows: a generated world's scenes, a clip-art corpus's content words, COCO "
    "instances); the scores "
    "are the last line. An image that cannot be read is reported and skipped: the scores are over the captioned "
    "images, metrics.json lists the skipped ones, and the exit status is then 1."
)
DEFAULT_METRICS = ",".join(ALL_METRICS)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..data import add_data_arguments
    from ._models import add_speed_arguments
    from ._options import add_adapters, add_max_new_tokens, add_num_beams, positive_int

    parser.add_argument("--model", default=None, help="Directory or Hub id of a full or adapter-only checkpoint.")
    add_adapters(
        parser,
        what="each is scored on its own (one line of scores each, its name first; its files in --output-dir/NAME, "
        "by default DIR/eval-SPLIT)",
    )
    add_data_arguments(parser, default_split="test", verify_option=True)
    add_num_beams(parser)
    add_max_new_tokens(parser)
    parser.add_argument("--batch-size", type=positive_int, default=16, help="Images per generate() call (per process).")
    parser.add_argument("--max-images", type=positive_int, default=None, help="Evaluate only the first N images.")
    parser.add_argument("--feature-cache", default=None, help="Use cached vision states (itune cache-features).")
    parser.add_argument(
        "--region-features",
        default=None,
        metavar="PATH",
        help="Precomputed region features (<image_id>.npz directory or .tsv), for an XGPT model trained on them "
        "(visual_source regions); an XGPT model with visual_source boxes reads the data's boxes column instead.",
    )
    parser.add_argument(
        "--datastore",
        default=None,
        metavar="DIR",
        help="A retrieval-augmented model's caption datastore (default: the model's own, DIR/datastore, when it has "
        "one): each image's prompt is the captions of its nearest datastore images; another domain's datastore "
        "changes what the model retrieves without training. Needs --feature-cache.",
    )
    parser.add_argument(
        "--metrics",
        default=None,
        help=f"Comma-separated (default: {DEFAULT_METRICS}, and those of {','.join(SCENE_METRICS)} that read what "
        "the data records: a generated world's scenes, a clip-art corpus's content words, COCO instances).",
    )
    parser.add_argument(
        "--instances",
        action="append",
        default=None,
        metavar="INSTANCES.json",
        help="COCO instance annotations of the evaluated images (e.g. instances_val2014.json; train2014 and val2014 "
        "for the Karpathy COCO split), for CHAIR (object hallucination); repeat it for several files. Default: the "
        "instances_<name>.json beside a --data captions_<name>.json, if there is one.",
    )
    parser.add_argument(
        "--shuffled-control",
        action="store_true",
        help="Also score the same captions against the references and scenes of other images (a fixed-seed "
        "derangement) and report the drop: how much of each score depends on the image.",
    )
    parser.add_argument(
        "--constant-caption",
        action="store_true",
        help="Also report the best constant caption beside the model's scores: of the data's train split's most "
        "frequent captions, the one with the best CIDEr-D there, and the one with the best grounded F1 (object F1 "
        "on a generated world, content-word F1 on a clip-art corpus), each written for every evaluated image and "
        'scored ("CIDEr (constant caption)", "Words_F1 (constant caption)"; the captions in metrics.json). '
        "Needs a train split; scores every candidate on it, which takes a while on a large one.",
    )
    parser.add_argument(
        "--output-dir",
        default=None,
        metavar="DIR",
        help="Where results.json, captions.jsonl and metrics.json go (default: eval-<split> "
        "inside a local --model directory, else ./eval-<split>; a directory holding other files is refused).",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="Write into an --output-dir holding files an evaluation did not write: they are removed (and named).",
    )
    add_speed_arguments(parser)


def coco_image_id(image_id: str) -> int | str:
    """COCO results files use integer ids where the dataset has them (cocoid); other ids ("000036") stay strings."""
    return int(image_id) if image_id.isdigit() and str(int(image_id)) == image_id else image_id


def run(args: argparse.Namespace) -> int:
    from accelerate import PartialState

    try:
        return _evaluate(args)
    finally:
        PartialState().destroy_process_group()  # explicitly, before interpreter teardown (a gloo group can hang there)


def _length_setting(max_new_tokens: int | None, generation) -> dict[str, int | None]:
    """How long the captions could be, for the report: `--max-new-tokens`, else the model's `max_new_tokens`, else its
    `max_length` (XGPT's: prompt included)."""
    if max_new_tokens or generation.max_new_tokens:
        return {"max_new_tokens": max_new_tokens or generation.max_new_tokens}
    return {"max_new_tokens": None, "max_length": generation.max_length}


def _score(rows, captions: dict, references: dict, metrics, scenes: dict | None) -> tuple[dict, dict]:
    """The overall scores and, for data with a `domain` column (NoCaps), each domain's, scored on its own as the
    official evaluation does (one Java start for all groups)."""
    from ..metrics import score_caption_groups

    groups: dict[str, list] = {"overall": list(captions)}
    if "domain" in rows.column_names:
        for image_id, domain in zip(rows["image_id"], rows["domain"]):
            if image_id in captions:
                groups.setdefault(domain, []).append(image_id)
    grouped = score_caption_groups(captions, references, groups, metrics=metrics, scenes=scenes)
    return dict(grouped.pop("overall")), grouped


def _metrics_and_scenes(args: argparse.Namespace) -> tuple[tuple[str, ...], dict | None]:
    """The metrics `--metrics` names (by default coco-caption's, and the scene metrics that read what the data
    records: `Objects` for a generated world's scenes, `ContentWords` for a clip-art corpus's content words, `CHAIR`
    for either and for COCO instances, `--instances`) and the data's records (None when no chosen metric needs
    them)."""
    from ..data.scenes import scenes_of_data
    from ..metrics import get_metric, scene_metrics_for
    from ._options import metrics_argument

    metrics = metrics_argument(args.metrics or DEFAULT_METRICS)
    wanted = args.metrics is None or any(get_metric(name).needs_scenes for name in metrics)
    scenes = scenes_of_data(args.data, args.instances, find_instances=True) if wanted else None
    if args.metrics is None and scenes:
        metrics = metrics_argument(",".join([*metrics, *scene_metrics_for(scenes)]))
    return metrics, scenes


def _train_references(args: argparse.Namespace) -> dict | None:
    """`--constant-caption`: image id -> captions of the data's train split (where the constant is chosen), read
    before any captioning; None without the flag.

    Raises:
        CommandError: the data has no train split, or streams it (shards).
    """
    from ..data import load_captions
    from ..data.args import column_options
    from . import CommandError

    if not getattr(args, "constant_caption", False):
        return None
    try:
        rows = load_captions(
            args.data,
            args.image_root,
            "train",
            on_missing=args.on_missing,
            check_counts=False,
            **{**column_options(args), "allow_outside_root": True},  # only its captions are read, never its images
        )
    except (KeyError, ValueError) as error:
        raise CommandError(f"--constant-caption chooses the caption on a train split; {args.data}: {error}") from None
    if not hasattr(rows, "column_names") or not hasattr(rows, "__len__") or len(rows) == 0:
        raise CommandError(f"--constant-caption chooses the caption on a train split; {args.data} has none to read")
    return {image_id: list(captions) for image_id, captions in zip(rows["image_id"], rows["captions"])}


def _constant_caption(train: dict, captions: dict, references: dict, scenes: dict | None, scores: dict) -> dict:
    """`--constant-caption`: the best constant caption (`evaluation.constant_caption_floor`), chosen on `train` and
    scored on the captioned images; its scores are added to `scores` beside the model's, for CIDEr and for the
    grounded metric that reads the data's records (`"CIDEr (constant caption)"`, `"Words_F1 (constant caption)"`)."""
    from ..evaluation import GROUNDED_CAPTIONS, constant_caption_floor
    from ..metrics import get_metric

    scored = {key: references[key] for key in captions}
    floor = constant_caption_floor(train, scored, scenes=scenes)
    if "CIDEr" in scores:
        scores["CIDEr (constant caption)"] = floor["CIDEr"]
    for name, field in GROUNDED_CAPTIONS.items():
        key = get_metric(name).card_key
        if f"{field}_scores" in floor and key in scores:
            scores[f"{key} (constant caption)"] = floor[f"{field}_scores"][key]
    return {"chosen_on": f"the train split ({len(train)} images)", "scored_on": f"the {len(scored)} captioned images",
            **floor}  # fmt: skip


def _shuffled_control(captions: dict, references: dict, metrics, scenes: dict | None, scores: dict) -> dict:
    """`--shuffled-control`: the pure-Python metrics of the captions against other images' references and scenes,
    the drop of each; the card metrics' shuffled score and drop are added to `scores` (`"CIDEr (shuffled)"`,
    `"CIDEr drop"`)."""
    from ..evaluation import SHUFFLE_SEED, shuffled_control
    from ..metrics.registry import card_metrics, get_metric

    if len(captions) < 2:
        return {"unavailable": "one captioned image: there is no other image to score it against"}
    fast = [name for name in metrics if not get_metric(name).needs_java]
    control = shuffled_control(captions, references, metrics=fast, scenes=scenes, seed=SHUFFLE_SEED)
    drop = {
        key: scores[key] - value
        for key, value in control.items()
        if isinstance(value, float) and isinstance(scores.get(key), float)
    }
    for key in (m.card_key for m in card_metrics() if m.card_key in drop):
        scores[f"{key} (shuffled)"], scores[f"{key} drop"] = control[key], drop[key]
    return {"derangement_seed": SHUFFLE_SEED, "scores": control, "drop": drop}


def _evaluate(args: argparse.Namespace) -> int:
    from accelerate import Accelerator

    from ._models import check_model_argument, load_model_argument
    from ._options import load_adapters_argument, model_or_adapters

    # a metric's typo or an unwritable output directory fails before captioning, not after
    metrics, scenes = _metrics_and_scenes(args)
    adapters = model_or_adapters(args)
    if adapters is None:
        check_model_argument(args.model)
    runs = _runs(args, adapters)
    train = _train_references(args)
    accelerator = Accelerator()
    rows = _load_rows(args, accelerator)
    if adapters is None:
        model, processor = load_model_argument(args.model, args.load_in)
        captioners = {None: lambda: model}
    else:
        loaded = load_adapters_argument(adapters)
        processor = loaded.processor
        captioners = {name: (lambda name=name: loaded.use(name)) for name in runs}
    status = 0
    for name, run_args in runs.items():
        model = captioners[name]().to(accelerator.device)
        scored = _evaluate_model(run_args, model, processor, rows, (metrics, scenes, train), accelerator, adapter=name)
        status = max(status, scored)
    return status


def _runs(args: argparse.Namespace, adapters: dict[str, str] | None) -> dict[str | None, argparse.Namespace]:
    """The evaluations to run: one for `--model` (named None), or one per adapter (`--use-adapter`, or all), each
    with its own `model` and output directory (`--output-dir/NAME`, or `eval-SPLIT` inside the adapter's
    directory); every output directory is checked before any work."""
    from ..utils.output_dirs import check_output_dir

    if adapters is None:
        runs = {None: args}
    else:
        chosen = [args.use_adapter] if args.use_adapter else list(adapters)
        runs = {
            name: argparse.Namespace(**{
                **vars(args), "model": adapters[name],
                "output_dir": str(Path(args.output_dir) / name) if args.output_dir else None,
            })
            for name in chosen
        }  # fmt: skip
    for run_args in runs.values():
        where = "--output-dir" if run_args.output_dir else "the output directory (--output-dir)"
        check_output_dir(_output_dir(run_args), where)
    return runs


def _evaluate_model(
    args: argparse.Namespace, model, processor, rows, metrics_and_scenes: tuple, accelerator, adapter: str | None
) -> int:
    """Caption `rows` with `model`, score them, write the output directory and print the scores (a line naming
    `adapter` when it is one of several); returns the exit status (1 when an image was skipped)."""
    import torch

    from ..evaluation import generate_captions
    from ..inference.decoding import decoded_on
    from . import CommandError
    from ._models import apply_speed_arguments, check_decoding, decoder

    metrics, scenes, train = metrics_and_scenes
    check_decoding(args, model)
    if accelerator.is_main_process:  # once the model and data load: a failed load leaves nothing behind
        _claim_output_dir(args)
    visual = _visual_inputs(args, model, processor, rows)
    model = apply_speed_arguments(model, args, processor)  # after the fingerprint: bf16 changes the tower
    skipped: list[dict[str, str]] = []
    prompts = _retrieval_prompts(args, model, visual, rows)
    calls_before = decoded_on(model)
    with torch.no_grad():
        captions = generate_captions(
            model,
            processor,
            rows,
            batch_size=args.batch_size,
            num_beams=args.num_beams,
            max_new_tokens=args.max_new_tokens,
            feature_cache=visual.feature_cache,
            region_features=visual.regions,
            accelerator=accelerator,
            skipped=skipped,
            prompts=prompts,
            generate=decoder(args),
        )
    if not accelerator.is_main_process:
        return 0  # the main process reports and exits 1 (a worker's 1 made the launcher stop it mid-write)
    _report_skipped(skipped, len(rows), summary=bool(captions))
    if not captions:  # each unreadable one named above; nothing is scored or written
        raise CommandError(f"none of the {len(rows)} images of {args.data} ({args.split} split) could be read")

    references = {i: list(c) for i, c in zip(rows["image_id"], rows["captions"])}
    scores, grouped = _score(rows, captions, references, metrics, scenes)
    report = {
        "model": args.model,
        **({"adapter": adapter} if adapter else {}),
        "data": args.data,
        "split": args.split,
        "images": len(captions),
        "skipped_images": len(skipped),
        "scored_over": f"the {len(captions)} captioned images"
        + (f" ({len(skipped)} unreadable skipped)" if skipped else ""),
        "skipped": skipped,
        "num_beams": args.num_beams or model.generation_config.num_beams,
        **_length_setting(args.max_new_tokens, model.generation_config),
        "int8": args.int8,
        "precision": getattr(model, "_itune_inference", {}).get("precision", "fp32"),
        "vocabulary": args.vocabulary,
        "decoding": args.decoding,
        "decoded_on": _paths_taken(model, args.decoding, calls_before),
        **({"visual_source": visual.source} if hasattr(getattr(model, "config", None), "visual_source") else {}),
        "visual_input": visual.describe(),
        "scores": scores,
    }
    if grouped:
        report["domains"] = {domain: grouped[domain] for domain in sorted(grouped)}
        for domain in sorted(grouped):
            scores[f"CIDEr_{domain}"] = grouped[domain].get("CIDEr")
    if args.shuffled_control:
        report["shuffled_control"] = _shuffled_control(captions, references, metrics, scenes, scores)
    if train is not None:
        report["constant_caption"] = _constant_caption(train, captions, references, scenes, scores)

    output = _write_outputs(args, captions, rows, references, report)
    print(f"wrote {output}/results.json, captions.jsonl and metrics.json", flush=True)
    row = {"adapter": adapter, **scores} if adapter else scores
    print(json.dumps(without_nan(row)))  # a metric with no value (NaN) prints as null
    return 1 if skipped else 0


def _paths_taken(model, decoding: str, before: dict[str, int]) -> str | dict[str, int]:
    """The path the captions were decoded on (`"fast"`, `"default"`), or how many `generate` calls took each: under
    `--decoding auto` a batch of padded prompts, or a failure to compile, takes the default path."""
    from ..inference.decoding import decoded_on, resolve_decoding

    taken = {path: calls - before.get(path, 0) for path, calls in decoded_on(model).items()}
    taken = {path: calls for path, calls in taken.items() if calls}
    if len(taken) == 1:
        return next(iter(taken))
    return taken or resolve_decoding(model, decoding)


def _retrieval_prompts(args: argparse.Namespace, model, visual, rows) -> dict[str, str] | None:
    """Each image's retrieval prompt from `--datastore` (else the model's own `datastore/`), or None for a model
    trained without retrieval."""
    from pathlib import Path

    from ..data.karpathy import read_groups
    from ..vision.datastore import DATASTORE_DIR, DatastoreError, model_datastore
    from . import CommandError

    own = Path(args.model) / DATASTORE_DIR if args.model and Path(args.model).is_dir() else None
    try:
        store = model_datastore(model, args.datastore, own)
    except DatastoreError as error:
        raise CommandError(f"--datastore {args.datastore}: {error}" if args.datastore else str(error)) from None
    if store is None:
        return None
    if visual.feature_cache is None:
        raise CommandError(
            f"{args.datastore or own}: a retrieval-augmented model retrieves by pooled vision-tower features, read "
            "from a feature cache: pass --feature-cache (itune cache-features makes one)"
        )
    groups = read_groups(args.data)
    ids = list(rows["image_id"])
    return store.prompts(visual.feature_cache, ids, groups=[groups.get(i) for i in ids])


def _load_rows(args: argparse.Namespace, accelerator):
    """The split to caption (at most `--max-images` of it), read by the main process first."""
    from ..data import load_data_from_args
    from . import CommandError

    with accelerator.main_process_first():
        rows = load_data_from_args(args)
    if not hasattr(rows, "column_names"):
        raise CommandError(f"--split is needed: {args.data} has several splits ({', '.join(rows)})")
    if args.max_images:
        rows = rows.select(range(min(args.max_images, len(rows))))
    unreferenced = [image for image, captions in zip(rows["image_id"], rows["captions"]) if not captions]
    if unreferenced:  # refused before any captioning: scoring stopped on the first of them at the end
        raise CommandError(
            f"{len(unreferenced)} of the {len(rows)} images of {args.data} ({args.split}) have no reference caption "
            f"(e.g. {', '.join(map(repr, unreferenced[:3]))}): itune eval scores against references; caption "
            "them with itune caption instead (NoCaps test: its references are not public)"
        )
    return rows


def _claim_output_dir(args: argparse.Namespace) -> None:
    """Take the output directory (refused when it holds what eval did not write, unless --overwrite); the lock is
    released at exit, so no other command writes these files meanwhile."""
    from ..utils.output_dirs import claim_output_dir

    claim_output_dir(
        _output_dir(args), command="itune eval", overwrite=args.overwrite,
        is_previous_output=lambda path: any((path / name).exists() for name in OUTPUT_FILES),
        inputs=[getattr(args, name, None) for name in ("model", "data", "image_root", "feature_cache", "vocabulary")],
    )  # fmt: skip


def _report_skipped(skipped: list[dict[str, str]], total: int, summary: bool = True) -> None:
    """Print each image that could not be read (path and reason) and, with `summary`, how many, on stderr."""
    import sys

    for item in skipped:
        print(f"itune eval: skipped {item['image_path']}: {item['reason']}", file=sys.stderr)
    if skipped and summary:
        print(
            f"itune eval: {len(skipped)} of {total} images could not be read and were skipped; the scores are over "
            f"the {total - len(skipped)} captioned images (metrics.json lists the skipped ones)",
            file=sys.stderr,
        )


def _visual_inputs(args: argparse.Namespace, model, processor, rows):
    """What the model reads of the images (`VisualInputs`): `--feature-cache` (checked against the vision tower),
    `--region-features`, or the rows' boxes; refused, naming the input, where they do not fit the model.

    Args:
        args: The parsed arguments (`feature_cache`, `region_features`, `data`, `split`).
        model: The loaded captioner.
        processor: Its processor.
        rows: The rows to caption.
    """
    from ..data.regions import RegionFeatures
    from ..vision.feature_cache import FeatureCache, read_fingerprint, vision_fingerprint
    from ..vision.inputs import VisualInputs, visual_source_of
    from . import CommandError

    regions = RegionFeatures(args.region_features) if args.region_features else None
    source = visual_source_of(model)
    if args.feature_cache and source == "regions":
        raise CommandError(
            f"--feature-cache {args.feature_cache}: the model reads precomputed regions (visual_source='regions'), "
            "not vision-tower states; pass --region-features PATH instead"
        )
    cache = None
    if args.feature_cache:
        dtype = read_fingerprint(args.feature_cache)["dtype"]
        cache = FeatureCache(
            args.feature_cache,
            expected_fingerprint=vision_fingerprint(model.vision_model, processor.image_processor, dtype),
        )
    visual = VisualInputs.for_model(model, feature_cache=cache, regions=regions)
    visual.check_rows(rows, f"{args.data} ({args.split} split)")
    return visual


def _output_dir(args: argparse.Namespace) -> Path:
    """Where the results go: `--output-dir`, else eval-<split> inside a local `--model` directory, else
    ./eval-<split>."""
    if args.output_dir:
        return Path(args.output_dir)
    local = Path(args.model)
    return (local if local.is_dir() else Path.cwd()) / f"eval-{args.split}"


OUTPUT_FILES = ("metrics.json", "results.json", "captions.jsonl")  # metrics.json first: it is written last


def _write_outputs(args: argparse.Namespace, captions: dict, rows, references: dict, report: dict) -> Path:
    """Write results.json (COCO results format), captions.jsonl and metrics.json, each atomically; returns their
    directory. The previous metrics.json goes first and the new one comes last, so an evaluation killed midway never
    leaves new captions beside the scores of old ones (results.json without metrics.json: unfinished)."""
    output = _output_dir(args)
    output.mkdir(parents=True, exist_ok=True)
    (output / "metrics.json").unlink(missing_ok=True)
    atomic_write_json(
        output / "results.json", [{"image_id": coco_image_id(i), "caption": c} for i, c in captions.items()], indent=1
    )
    paths = dict(zip(rows["image_id"], rows["image_path"]))
    lines = (
        json.dumps({"image_id": i, "image_path": paths[i], "caption": c, "references": references[i]}) + "\n"
        for i, c in captions.items()
    )
    atomic_write_text(output / "captions.jsonl", "".join(lines))
    atomic_write_json(output / "metrics.json", without_nan(report))
    return output

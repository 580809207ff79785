"""Does XGPT's pre-training do something here? A small version of the paper's Table 2 on this machine.

Out-of-domain data: the synthetic "alt-text" world (`itune make-synthetic --world alt-text`: other shapes, short noisy
captions, a fifth unrelated to the image), standing in for Conceptual Captions. In-domain data: about 200 training
images of the captions world (the test split scores). Conditions, fine-tuned (IC only) with several seeds:

* ``none``: fine-tuning from scratch;
* ``ic``: stage 1 on alt-text with IC only, then fine-tuning from the average of its top-4 checkpoints;
* ``all``: stage 1 with IC, IMLM, IDA and TIFG (weights 1, alternating updates), then fine-tuning from its top-4
  average;
* ``two-stage``: ``all``'s top-4 average, then stage 2 on the in-domain images (IC 1, the others 0.3), then
  fine-tuning.

Not in the default conditions (name them in ``--conditions``): ``ic+imlm``, ``ic+ida``, ``ic+tifg`` (stage 1 with IC
and one other task, the paper's Table 2 rows 2-4) and ``all-multi`` (``all`` with one [MASK] per masked token in IDA
instead of one per span, the paper's Table 4).

Every command is a plain `itune` call (printed as it runs). Each finished run appends a line to `--results`
(JSON lines), so a cut-short study keeps its numbers; `--table-only` prints the Markdown table from that file.
Each seed runs the whole chain: its own pre-training (stage 1, stage 2) and its own fine-tuning, so the sd measures
pre-training and fine-tuning noise together (`--pretrain-seed N` pre-trains once, with seed N, for every seed: the
cheaper study, whose sd is fine-tuning noise only). Scores are CIDEr-D x 100, as in the paper's tables.

    python benchmarks/study_xgpt_pretraining.py --work-dir outputs/study-pretrain
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALL_TASKS = ("--tasks", "ic,imlm,ida,tifg")
STAGE1 = {  # condition -> the options of its stage-1 pre-training on alt-text
    "ic": (),
    "ic+imlm": ("--tasks", "ic,imlm"),
    "ic+ida": ("--tasks", "ic,ida"),
    "ic+tifg": ("--tasks", "ic,tifg"),
    "all": ALL_TASKS,
    "all-multi": (*ALL_TASKS, "--ida-masking", "multi"),
}
TITLES = {
    "none": "no pre-training",
    "ic": "stage 1 (alt-text): IC only",
    "ic+imlm": "stage 1 (alt-text): IC + IMLM",
    "ic+ida": "stage 1 (alt-text): IC + IDA",
    "ic+tifg": "stage 1 (alt-text): IC + TIFG",
    "all": "stage 1 (alt-text): IC + IMLM + IDA + TIFG",
    "two-stage": "stage 1 (all four) + stage 2 (in-domain, IC 1, others 0.3)",
    "all-multi": "stage 1 (alt-text): all four, IDA with one [MASK] per token",
}
CONDITIONS = tuple(TITLES)
DEFAULT_CONDITIONS = "none,ic,all,two-stage"


def itune(*args) -> str:
    command = [sys.executable, "-m", "itune_hf.cli", *map(str, args)]
    print("$ itune " + " ".join(map(str, args)), flush=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(f"failed: {' '.join(map(str, args))}\n{result.stderr[-3000:]}")
    return result.stdout


def train(args, out: Path, data: Path, cache: Path, steps: int, seed: int, *extra, checkpoints: int = 4) -> Path:
    """An `itune train` run (or the finished one `out` holds), keeping `checkpoints` evenly spaced ones: 4 for a run
    whose top-4 average comes next, 1 (the final, always written) for a fine-tuning run."""
    if (out / "model.safetensors").is_file():  # done by an earlier (interrupted) study: only if it ran these steps
        done_steps = json.loads((out / "train_summary.json").read_text())["steps"]
        if done_steps != steps:
            raise SystemExit(f"{out} holds a run of {done_steps} steps, not {steps}: use another --work-dir.")
        return out
    itune(
        "train", "--preset", args.preset, "--data", data, "--feature-cache", cache, "--output-dir", out,
        "--max-steps", steps, "--batch-size", args.batch_size, "--learning-rate", args.learning_rate,
        "--warmup-steps", max(1, steps // 10), "--eval-split", "none", "--save-every", max(1, steps // checkpoints),
        "--keep-checkpoints", checkpoints, "--report-to", "none", "--max-caption-length", 32, "--seed", seed,
        "--adam-beta2", 0.98, "--overwrite", *extra,
    )  # fmt: skip
    return out


def averaged(run: Path) -> Path:
    target = run.with_name(run.name + "-top4")
    if not (target / "model.safetensors").is_file():
        itune("average-checkpoints", run, "--output-dir", target, "--top", 4)
    drop_checkpoints(run)
    return target


def drop_checkpoints(run: Path) -> None:
    """Delete a finished run's checkpoints (weights and optimizer states): the study reruns an interrupted run from
    the start, so once averaged or scored they are dead weight (tens of GB over a study at xgpt-demo size)."""
    shutil.rmtree(run / "checkpoints", ignore_errors=True)


def score(args, model: Path, data: Path, cache: Path, out: Path) -> dict:
    """CIDEr and object F1 on the test split, CIDEr against shuffled images (`--shuffled-control`), and how many
    distinct captions the model wrote for its images (1: it ignores them)."""
    stdout = itune(
        "eval", "--model", model, "--data", data, "--split", "test", "--feature-cache", cache, "--num-beams", 2,
        "--metrics", "CIDEr,Objects", "--shuffled-control", "--output-dir", out,
    )  # fmt: skip
    captions = {json.loads(line)["caption"] for line in (out / "captions.jsonl").read_text().splitlines()}
    scores = json.loads(stdout.strip().splitlines()[-1])
    return {
        "CIDEr": scores["CIDEr"],
        "Object_F1": scores.get("Object_F1"),
        "CIDEr_shuffled": scores.get("CIDEr (shuffled)"),
        "distinct_captions": len(captions),
    }


def blind_floor(domain: Path, candidates: int = 300) -> dict:
    """What a captioner that ignores the image can score: the one training caption (of the `candidates` most frequent)
    with the best CIDEr-D on the training split, written for every test image (`constant_caption_floor`)."""
    from itune_hf.data import load_captions
    from itune_hf.data.scenes import read_scenes
    from itune_hf.evaluation import constant_caption_floor

    splits = load_captions(domain)
    refs = {
        name: dict(zip(splits[name]["image_id"], map(list, splits[name]["captions"]))) for name in ("train", "test")
    }
    floor = constant_caption_floor(refs["train"], refs["test"], scenes=read_scenes(domain), candidates=candidates)
    return {"caption": floor["caption"], "CIDEr": floor["CIDEr"], "Object_F1": floor.get("Object_F1")}


def prepare(args, work: Path) -> dict[str, Path]:
    from itune_hf.data import make_synthetic

    alt, domain = work / "alt-text" / "dataset.json", work / "in-domain" / "dataset.json"
    if not alt.is_file():  # an earlier (interrupted) study's worlds are kept: its runs and caches read them
        make_synthetic(alt.parent, num_images=args.alt_images, seed=11, world="alt-text", overwrite=True)
    if not domain.is_file():  # about 200 training images in-domain, the rest to test on (runs do not validate)
        make_synthetic(
            domain.parent, num_images=args.domain_images + args.test_images, seed=5,
            split_fractions=(args.domain_images, 0, args.test_images), overwrite=True,
        )  # fmt: skip
    paths = {"alt": alt, "domain": domain, "alt_cache": work / "alt-cache", "domain_cache": work / "domain-cache"}
    for data, cache in ((alt, paths["alt_cache"]), (domain, paths["domain_cache"])):
        if not (cache / "fingerprint.json").is_file():
            itune("cache-features", "--preset", args.preset, "--data", data, "--output-dir", cache)
    if not (work / "blind.json").is_file():
        (work / "blind.json").write_text(json.dumps(blind_floor(domain)))
    return paths


def starting_points(
    args, work: Path, paths: dict[str, Path], seed: int, conditions: list[str]
) -> dict[str, Path | None]:
    """The model each of `conditions` fine-tunes from, pre-trained with `seed` (or --pretrain-seed for every seed)."""
    alt, alt_cache = paths["alt"], paths["alt_cache"]
    seed = seed if args.pretrain_seed is None else args.pretrain_seed
    starts: dict[str, Path | None] = {"none": None}
    needed = set(conditions) | ({"all"} if "two-stage" in conditions else set())
    for condition in [c for c in STAGE1 if c in needed]:
        run = work / f"pre-{condition}-{seed}"
        starts[condition] = averaged(train(args, run, alt, alt_cache, args.pretrain_steps, seed, *STAGE1[condition]))
    if "two-stage" in conditions:
        stage2 = train(
            args, work / f"pre-stage2-{seed}", paths["domain"], paths["domain_cache"], args.stage2_steps, seed,
            *ALL_TASKS, "--task-weights", "1,0.3,0.3,0.3", "--init-model", starts["all"],
        )  # fmt: skip
        starts["two-stage"] = averaged(stage2)
    return starts


def table(results: list[dict], blind: dict | None = None) -> str:
    by_condition: dict[str, list[dict]] = {}
    unique = {(row["condition"], row["seed"]): row for row in results}  # a run scored twice counts once
    for (condition, _), row in sorted(unique.items()):
        by_condition.setdefault(condition, []).append(row)
    lines = ["| condition | seeds | CIDEr mean | sd | per seed | distinct captions (of the test images) | object F1 "
             "mean | CIDEr mean, shuffled images |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for condition in CONDITIONS:
        rows = by_condition.get(condition)
        if not rows:
            continue
        values = [100 * row["CIDEr"] for row in rows]
        sd = statistics.stdev(values) if len(values) > 1 else float("nan")
        shown = ", ".join(f"{v:.1f}" for v in values)
        distinct = ", ".join(str(row.get("distinct_captions", "?")) for row in rows)
        scene = f"{_mean_of(rows, 'Object_F1')} | {_mean_of(rows, 'CIDEr_shuffled')}"
        lines.append(f"| {TITLES[condition]} | {len(values)} | {statistics.mean(values):.1f} | {sd:.1f} | {shown} "
                     f"| {distinct} | {scene} |")  # fmt: skip
    if blind:
        lines.append(f"| image-blind floor: \"{blind['caption']}\" for every image | - | {100 * blind['CIDEr']:.1f} "
                     f"| - | - | 1 | {_mean_of([blind], 'Object_F1')} | - |")  # fmt: skip
    return "\n".join(lines)


def _mean_of(rows: list[dict], key: str) -> str:
    """The mean of `key` over `rows`, x100; "-" where a row lacks it (a run scored before it was measured)."""
    values = [row.get(key) for row in rows]
    return "-" if any(v is None for v in values) else f"{100 * statistics.mean(values):.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", type=Path, default=Path("outputs/study-pretrain"))
    parser.add_argument(
        "--results", type=Path, default=None, help="JSON lines, appended to (default: WORK_DIR/results.jsonl)."
    )
    parser.add_argument("--preset", default="xgpt-demo")
    parser.add_argument("--conditions", default=DEFAULT_CONDITIONS, help=f"Any of {', '.join(CONDITIONS)}.")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0, help="Run seeds FIRST_SEED .. SEEDS-1 only.")
    parser.add_argument(
        "--pretrain-seed", type=int, default=None, help="Pre-train once, with this seed, for all seeds."
    )
    parser.add_argument("--alt-images", type=int, default=2000)
    parser.add_argument("--domain-images", type=int, default=200)
    parser.add_argument("--test-images", type=int, default=100)
    parser.add_argument("--pretrain-steps", type=int, default=300)
    parser.add_argument("--stage2-steps", type=int, default=60)
    parser.add_argument("--finetune-steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--table-only", action="store_true", help="Print the table of --results and stop.")
    args = parser.parse_args()
    args.conditions = [c for c in args.conditions.split(",") if c]
    unknown = sorted(set(args.conditions) - set(CONDITIONS))
    if unknown:
        parser.error(f"--conditions: unknown {', '.join(unknown)}; choose from {', '.join(CONDITIONS)}")
    work = args.work_dir.resolve()
    results_file = args.results or work / "results.jsonl"
    if not args.table_only:
        sys.path.insert(0, str(ROOT))
        work.mkdir(parents=True, exist_ok=True)
        started = time.time()
        paths = prepare(args, work)
        done = {(r["condition"], r["seed"]) for r in map(json.loads, results_file.read_text().splitlines())} \
            if results_file.is_file() else set()  # fmt: skip
        for seed in range(args.first_seed, args.seeds):  # a cut-short study: every condition, first seeds
            todo = [condition for condition in args.conditions if (condition, seed) not in done]
            starts = starting_points(args, work, paths, seed, todo)
            for condition in todo:
                run = work / f"ft-{condition}-{seed}"
                extra = ("--init-model", starts[condition]) if starts[condition] else ()
                train(
                    args, run, paths["domain"], paths["domain_cache"], args.finetune_steps, seed, *extra, checkpoints=1
                )
                drop_checkpoints(run)
                scores = score(args, run, paths["domain"], paths["domain_cache"], work / f"eval-{condition}-{seed}")
                row = {"condition": condition, "seed": seed, **scores, "elapsed_s": round(time.time() - started)}
                with results_file.open("a") as handle:
                    handle.write(json.dumps(row) + "\n")
                print(json.dumps(row), flush=True)
    rows = [json.loads(line) for line in results_file.read_text().splitlines()] if results_file.is_file() else []
    blind = json.loads((work / "blind.json").read_text()) if (work / "blind.json").is_file() else None
    print(table(rows, blind))


if __name__ == "__main__":
    main()

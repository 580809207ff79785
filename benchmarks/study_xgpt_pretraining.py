"""Does XGPT's pre-training help here, per task, and why not if not? A paired version of the paper's Table 2.

Out-of-domain data: the synthetic alt-text world (`itune make-synthetic --world alt-text`: 1-2 circles, stars,
diamonds or crosses; 2-6-word captions), standing in for Conceptual Captions, in two arms (`--arms`) that show the
same images: ``clean`` (`--caption-noise 0`: every caption names every object of its image) and ``noisy`` (the
world's default noise: a fifth of the captions unrelated, a quarter of the words dropped). In-domain data: the captions
world (`--domain-world`), `--finetune-images` training images (the low-resource regime, 50-200, where the paper's
effect should be largest), a validation split that chooses the fine-tuning learning rate and a test split scored once.

Factors: the frozen tower (`--towers`: ``pretrained``, preset `xgpt-demo-resnet` itself: the demo's tiny ResNet
pre-trained by the package on first use into $ITUNE_CACHE, with the preset's region feature norm, the tower over which
XGPT names the captions world's objects in 300 steps; ``random``, preset `xgpt-demo`: its random ViT, which does not
see the shapes, docs/xgpt.md), the stage-1 arm, and the condition (`--conditions`). Both towers read the worlds'
64-pixel images as they are (their processors' 64x64 crop: no resize). The ResNet was pre-trained on the captions
world's circles, squares, triangles and stars; the alt-text world's diamonds and crosses it never saw (the gate says
whether stage 1 grounds anyway).

* ``none``: fine-tuning from the start model (no pre-training; one row per tower, shared by both arms);
* ``ic``, ``ic+imlm``, ``ic+ida``, ``ic+tifg``, ``all`` (IC + IMLM + IDA + TIFG), ``all-multi`` (``all`` with one
  [MASK] per masked token in IDA, Table 4): stage 1 on alt-text, then fine-tuning from its top-4 average;
* ``two-stage``: ``all``'s stage 1, then stage 2 in-domain (IC 1, the others 0.3), then fine-tuning.

The design, point by point:

* **Same start.** Each (tower, seed) has one start model (the tower's preset's XGPT, trainable weights drawn with the
  seed): stage 1 and ``none``'s fine-tuning both begin there, and every run passes the same `--seed`, so a
  seed's fine-tuning data and order are the same in every condition (paired seeds).
* **Equal updates.** Stage 1 makes `--stage1-updates` optimizer updates in every condition, counting each task's
  update of the alternating schedule (IC alone: that many iterations; all four: a quarter as many). Every condition
  then makes `--finetune-updates` in-domain updates: ``none`` and the one-stage conditions all in fine-tuning,
  ``two-stage`` its `--stage2-updates` in stage 2 and the rest in fine-tuning. Stage 1 sees more captions than
  fine-tuning (refused otherwise), and the counts must split evenly over each condition's tasks (refused otherwise).
* **Grounding gate.** After stage 1 the top-4 average captions the alt-text test split (beam 2). It counts as grounded
  when its CIDEr-D beats both the arm's blind floor (the best constant training caption, `constant_caption_floor`) and
  the same captions against shuffled images (`--shuffled-control`) by `GATE.margin` (0.05, 5 points x100), and it
  writes at least `GATE.distinct_share` (a fifth) as many distinct captions as there are test images (the alt-text
  world has 20 single-object looks and 400 ordered pairs; one caption for every image is the failure seen before).
  A seed that did not ground is not fine-tuned (`--gate report` fine-tunes it anyway and says so); its row reports
  "stage 1 did not ground" with its numbers.
* **Learning rate chosen on validation.** Each (condition, seed) is fine-tuned at every rate of `--finetune-lrs`,
  scored on the validation split (CIDEr-D, beam 2), and only the best one's model captions the test split, once.
* **Paired differences.** Every row gives test CIDEr-D, object F1 (`Objects`) and the shuffled control; a pre-trained
  row adds its difference from ``none`` of the same tower and seed, mean ± sd over the seeds where both exist, and a
  verdict per metric: helps / hurts when the mean over at least 3 seeds is more than two standard deviations of the
  differences from 0, else no claim.
* **Why not.** The memory-attention share (`memory_shares`: how much of the decoder's attention goes to the regions
  rather than the caption prefix, averaged over layers, heads and the positions of its own greedy captions) of the
  model that fine-tuning starts from, on the stage-1 world's test images and on the in-domain validation images.
  IMLM, IDA and TIFG put text in the encoder memory; if the shared stack learns to read text instead of regions, this
  share falls.

Stages 1 and 2 train at `--stage1-lr` (1e-3, xgpt-demo's own default), batch `--batch-size` for every run, AdamW
(0.9, 0.98), a tenth of the steps of warm-up.

The driver prepares in its own process (the worlds, their floors, each tower loaded once, the start models, the
feature caches); every later step is a plain `itune` command (printed as it runs) or the memory-share worker, each a
fresh process; `--jobs N` runs N at once (stage 1, then stage 2, then fine-tuning runs, then test scoring). Each
finished step appends a JSON line to `--results` (default WORK_DIR/results.jsonl); `--resume` continues a cut-short
study from it, `--table-only` prints its table. Scores are x100. `--tiny` is a smoke run (tiny random models:
`xgpt-tiny-random-resnet`, a random ResNet of the demo's architecture, for ``pretrained``, so that it goes through the
convolutional tower and the region feature norm, and `xgpt-tiny-random` for ``random``; a few images and updates, in
this process, about a minute of CPU; with `--jobs`, fresh processes): its numbers mean nothing.

The GPU run (issue 27 item 6; not made yet). First the reduced design, meant to fit one 10-minute device call (an
estimate: benchmarks/RESULTS.md): the tower that sees shapes, the clean arm, no pre-training against IC only and all
four tasks, 3 paired seeds, stage 1 of 1,200 updates (4x fine-tuning's captions), on a lent GPU with 16 cores::

    python benchmarks/study_xgpt_pretraining.py --work-dir outputs/study-pretrain --jobs 9 --threads 1 \\
        --towers pretrained --arms clean --conditions none,ic,all --seeds 3 --stage1-updates 1200 \\
        --finetune-images 100 --finetune-lrs 1e-5,1e-4,1e-3 --mixed-precision bf16

The whole design (about 6x the updates, an estimated 45-60 min of device time: several sessions, a (tower, arm)
slice each in its own --work-dir; RESULTS.md)::

    python benchmarks/study_xgpt_pretraining.py --work-dir outputs/study-pretrain --jobs 9 --threads 1 \\
        --towers pretrained,random --arms clean,noisy --conditions none,ic,all,two-stage --seeds 3 \\
        --finetune-images 100 --finetune-lrs 1e-5,1e-4,1e-3 --mixed-precision bf16

    python benchmarks/study_xgpt_pretraining.py --tiny --work-dir outputs/study-pretrain-tiny   # smoke run

Real alt-text (`--corpus clipart`, issue 45 item 5): the clip-art corpus `itune make-clipart` writes (`--clipart`, its
dataset.json) in place of both worlds. Its training split is divided by near-duplicate group (the entries' `group`,
a stable hash: no group, so no pixels, title or numbered series, in both parts) into a fine-tuning part of about
`--finetune-share` of the images (10%), whose clean captions (`sentences`) make the in-domain data with the corpus's
own val and test splits, and a pre-training part, whose raw alt-text (`alt_text`: title, keywords and path words, read
with `--caption-column alt_text`) is stage 1's captions, arm ``raw``; the test split's alt-text is the gate's
references. Fine-tuning never sees a pre-training image. The tower is the real ImageNet EfficientNet-Lite0 read as
hypercolumns (``lite0``: preset `xgpt-lite0`; the study's batch and learning rates, not the preset's), and the
grounded metric the content words named (`ContentWords`: F1 against each image's recorded content words) in place of
`Objects`. The
CPU run of IC against none (2 cores, about 84 minutes; RESULTS.md, "XGPT pre-training on real alt-text"). Its stage 1
writes few distinct captions (whole training alt-texts), so the gate's distinct-caption rule fails while its CIDEr-D
is 6x the shuffled control's: `--gate report` fine-tunes it anyway and the table says so::

    python benchmarks/study_xgpt_pretraining.py --corpus clipart --clipart outputs/clipart/dataset.json \\
        --work-dir outputs/study-pretrain-clipart --jobs 2 --threads 1 --conditions none,ic --seeds 3 \\
        --stage1-updates 1200 --finetune-updates 300 --finetune-lrs 1e-4,3e-4,1e-3,3e-3 --gate report \\
        --mixed-precision auto
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALL_FOUR = ("ic", "imlm", "ida", "tifg")
#: condition -> its stage-1 tasks on alt-text (None: no stage 1) and any other stage-1 options
STAGE1: dict[str, tuple[tuple[str, ...] | None, tuple[str, ...]]] = {
    "none": (None, ()),
    "ic": (("ic",), ()),
    "ic+imlm": (("ic", "imlm"), ()),
    "ic+ida": (("ic", "ida"), ()),
    "ic+tifg": (("ic", "tifg"), ()),
    "all": (ALL_FOUR, ()),
    "all-multi": (ALL_FOUR, ("--ida-masking", "multi")),
    "two-stage": (ALL_FOUR, ()),  # all's stage 1, then stage 2 in-domain
}
TITLES = {
    "none": "no pre-training",
    "ic": "IC only",
    "ic+imlm": "IC + IMLM",
    "ic+ida": "IC + IDA",
    "ic+tifg": "IC + TIFG",
    "all": "IC + IMLM + IDA + TIFG",
    "all-multi": "all four, IDA one [MASK] per token",
    "two-stage": "all four + stage 2 in-domain",
}
CONDITIONS = tuple(TITLES)
STAGE1_OF = {c: "all" if c == "two-stage" else c for c in CONDITIONS}  # whose stage 1 a condition fine-tunes after
ARMS = {"clean": 0.0, "noisy": None}  # arm -> its --caption-noise rate (None: the world's default rates)
#: tower -> the preset that brings it: the demo's ResNet pre-trained by the package (its region feature norm with it),
#: and xgpt-demo's random ViT; --tiny: tiny random stand-ins of the same two tower kinds (a ResNet, a ViT)
TOWER_PRESETS = {"pretrained": "xgpt-demo-resnet", "random": "xgpt-demo"}
TINY_TOWER_PRESETS = {"pretrained": "xgpt-tiny-random-resnet", "random": "xgpt-tiny-random"}
TOWERS = tuple(TOWER_PRESETS)


@dataclass(frozen=True)
class Corpus:
    """What the study reads in one corpus: its towers (name -> XGPT preset, and the --tiny stand-ins), its alt-text
    arms, the grounded metric `itune eval` scores (and the key its score is reported under), and the entry field
    stage 1 reads as captions (`--caption-column`; None: `sentences`)."""

    towers: dict[str, str]
    tiny_towers: dict[str, str]
    arms: tuple[str, ...]
    metric: str
    grounded_key: str
    grounded_title: str
    alt_caption_column: str | None = None


CORPORA = {
    "synthetic": Corpus(TOWER_PRESETS, TINY_TOWER_PRESETS, tuple(ARMS), "Objects", "Object_F1", "object F1"),
    "clipart": Corpus(
        {"lite0": "xgpt-lite0"},
        {"lite0": "xgpt-tiny-random"},
        ("raw",),
        "ContentWords",
        "Words_F1",
        "words F1",
        alt_caption_column="alt_text",
    ),  # fmt: skip
}
STAGE2_WEIGHTS = "1,0.3,0.3,0.3"


@dataclass(frozen=True)
class Gate:
    """When a stage-1 model counts as grounded: it beats its world's blind floor and the shuffled-image control by
    `margin` CIDEr-D (x1, not x100) and writes at least `distinct_share` x the test images distinct captions."""

    margin: float = 0.05
    distinct_share: float = 0.2


GATE = Gate()


# ------------------------------------------------------------------------------------------------ the decisions
def gate_decision(stage1: dict, floor_cider: float, gate: Gate = GATE) -> tuple[bool, str]:
    """Whether a stage-1 model grounded, and why not: `stage1` holds its alt-text test CIDEr, CIDEr against shuffled
    images, distinct captions and test images; `floor_cider` the best constant caption's CIDEr there."""
    reasons = []
    if stage1["CIDEr"] < floor_cider + gate.margin:
        reasons.append(f"CIDEr {100 * stage1['CIDEr']:.1f} not {100 * gate.margin:.0f} above the blind floor "
                       f"{100 * floor_cider:.1f}")  # fmt: skip
    if stage1["CIDEr"] < stage1["CIDEr_shuffled"] + gate.margin:
        reasons.append(f"CIDEr {100 * stage1['CIDEr']:.1f} not {100 * gate.margin:.0f} above shuffled images "
                       f"{100 * stage1['CIDEr_shuffled']:.1f}")  # fmt: skip
    if stage1["distinct_captions"] < gate.distinct_share * stage1["images"]:
        reasons.append(f"{stage1['distinct_captions']} distinct captions for {stage1['images']} images")
    return not reasons, "; ".join(reasons)


def paired_difference(rows: dict[int, dict], baseline: dict[int, dict], key: str) -> tuple[float, float, int]:
    """Mean and sd over the seeds both have of `rows[seed][key] - baseline[seed][key]` (x100), and their count;
    the sd is NaN for one seed, the mean NaN for none."""
    diffs = [100 * (rows[s][key] - baseline[s][key]) for s in sorted(rows.keys() & baseline.keys())
             if rows[s].get(key) is not None and baseline[s].get(key) is not None]  # fmt: skip
    mean = statistics.mean(diffs) if diffs else math.nan
    sd = statistics.stdev(diffs) if len(diffs) > 1 else math.nan
    return mean, sd, len(diffs)


def verdict(mean: float, sd: float, n: int) -> str:
    """helps / hurts when the mean paired difference over at least 3 seeds is more than two standard deviations (of
    the differences) from 0, the house's rule for claiming an ordering; no claim otherwise."""
    if n < 3 or math.isnan(sd):
        return "no claim (under 3 seeds)"
    if abs(mean) <= max(2 * sd, 1e-9):  # (a zero difference with a zero sd claims nothing either)
        return "no claim"
    return "helps" if mean > 0 else "hurts"


def choose_lr(val_rows: list[dict]) -> dict:
    """The fine-tuning run with the best validation CIDEr (the smaller learning rate on a tie)."""
    return max(val_rows, key=lambda row: (row["CIDEr"], -row["lr"]))


# ------------------------------------------------------------------------------------------------ commands
class Runner:
    """Runs `itune` commands (fresh processes, or in this process for --tiny) and appends results thread-safely."""

    def __init__(self, args) -> None:
        self.args = args
        self.lock = threading.Lock()

    def itune(self, *args) -> str:
        args = [str(a) for a in args]
        print("$ itune " + " ".join(args), flush=True)
        if self.args.in_process:
            from itune_hf.cli import main

            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                status = main(args)
            if status:
                raise SystemExit(f"failed ({status}): itune {' '.join(args)}")
            return out.getvalue()
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
        if self.args.threads:
            env["OMP_NUM_THREADS"] = str(self.args.threads)
        result = subprocess.run([sys.executable, "-m", "itune_hf.cli", *args], capture_output=True, text=True, env=env)
        if result.returncode != 0:
            raise SystemExit(f"failed: itune {' '.join(args)}\n{result.stderr[-3000:]}")
        return result.stdout

    def record(self, row: dict) -> dict:
        with self.lock:
            with self.args.results.open("a") as handle:
                handle.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
        return row


def train(run: Runner, out: Path, tower: str, data: Path, cache: Path, steps: int, seed: int, lr: float, *extra,
          checkpoints: int = 1) -> Path:  # fmt: skip
    """An `itune train` run over `tower`'s preset (or the finished one `out` holds: only if it ran `steps`), keeping
    `checkpoints` evenly spaced ones: 4 for a run whose top-4 average comes next, 1 (the final) for a fine-tuning
    run."""
    if (out / "model.safetensors").is_file():
        done_steps = json.loads((out / "train_summary.json").read_text())["steps"]
        if done_steps != steps:
            raise SystemExit(f"{out} holds a run of {done_steps} steps, not {steps}: use another --work-dir.")
        return out
    args = run.args
    run.itune(
        "train", "--preset", args.tower_presets[tower], "--data", data, "--feature-cache", cache, "--output-dir", out,
        "--max-steps", steps, "--batch-size", args.batch_size, "--learning-rate", lr,
        "--warmup-steps", max(1, steps // 10), "--eval-split", "none", "--save-every", max(1, steps // checkpoints),
        "--keep-checkpoints", checkpoints, "--report-to", "none", "--max-caption-length", 32, "--seed", seed,
        "--adam-beta2", 0.98, "--mixed-precision", args.mixed_precision, "--overwrite", *extra,
    )  # fmt: skip
    if checkpoints == 1:  # a fine-tuning run: its final model is all that is scored
        shutil.rmtree(out / "checkpoints", ignore_errors=True)
    return out


def averaged(run: Runner, trained: Path) -> Path:
    """The average of a run's top-4 checkpoints (no validation: its newest 4); its checkpoints are then dropped."""
    target = trained.with_name(trained.name + "-top4")
    if not (target / "model.safetensors").is_file():
        run.itune("average-checkpoints", trained, "--output-dir", target, "--top", 4)
    shutil.rmtree(trained / "checkpoints", ignore_errors=True)
    return target


def caption_options(args, data_name: str) -> dict[str, str]:
    """`load_captions` options for the study's data `data_name`: the corpus's alt-text field as the captions of its
    stage-1 data (clip art's `alt_text`), else none (`sentences`)."""
    column = args.spec.alt_caption_column if data_name.startswith("alt-") else None
    return {"caption_column": column} if column else {}


def caption_args(args, data_name: str) -> tuple[str, ...]:
    """`caption_options` as `itune` options."""
    return tuple(item for column in caption_options(args, data_name).values() for item in ("--caption-column", column))


def evaluate(run: Runner, model: Path, data: Path, split: str, out: Path, *extra, control: bool = True) -> dict:
    """CIDEr and the corpus's grounded F1 (object F1; clip art: content words) of `model`'s beam-2 captions of `split`
    (from the pixels, through the model's own tower; `extra`: data options such as `caption_args`), with the
    shuffled-image control, and how many distinct captions it wrote for how many images."""
    corpus = run.args.spec
    stdout = run.itune(
        "eval", "--model", model, "--data", data, "--split", split, "--num-beams", 2, "--metrics",
        f"CIDEr,{corpus.metric}", *(("--shuffled-control",) if control else ()), "--output-dir", out, "--overwrite",
        *extra,
    )  # fmt: skip
    captions = [json.loads(line)["caption"] for line in (out / "captions.jsonl").read_text().splitlines()]
    scores = json.loads(stdout.strip().splitlines()[-1])
    f1 = corpus.grounded_key
    return {
        "CIDEr": scores["CIDEr"], f1: scores.get(f1),
        "CIDEr_shuffled": scores.get("CIDEr (shuffled)"), f"{f1}_shuffled": scores.get(f"{f1} (shuffled)"),
        "distinct_captions": len(set(captions)), "images": len(captions),
    }  # fmt: skip


def memory_share(model: Path, data: Path, split: str, images: int) -> float:
    """The decoder's mean attention share on the memory (`memory_shares`: regions, not the caption prefix) over
    layers, heads and the positions of the model's own greedy captions of the first `images` of `split`."""
    import torch
    from PIL import Image

    from itune_hf.data import load_captions
    from itune_hf.models.loading import load_captioner

    captioner, processor = load_captioner(str(model))
    captioner.eval()
    rows = load_captions(str(data))[split]
    rows = rows.select(range(min(images, len(rows))))
    pixels = processor(images=[Image.open(p).convert("RGB") for p in rows["image_path"]], return_tensors="pt")
    with torch.no_grad():
        sequence = captioner.generate(pixel_values=pixels["pixel_values"], num_beams=1, max_new_tokens=20)
        out = captioner(pixel_values=pixels["pixel_values"], decoder_input_ids=sequence[:, :-1], output_attentions=True)
    shares = torch.stack(out.memory_shares).mean(dim=(0, 2))  # (batch, positions): layers and heads averaged
    inputs = sequence[:, :-1]  # position t reads inputs[:, t]: after the caption's end (an EOS read) it is padding
    ended = (inputs[:, 1:] == captioner.config.eos_token_id).cumsum(1) > 0
    valid = torch.cat([torch.ones(len(inputs), 1, dtype=torch.bool), ~ended], dim=1)
    return float(shares[valid].mean())


def memory_shares(run: Runner, model: Path, paths: dict, arm: str) -> dict:
    """`memory_share` on the stage-1 world's test images and the in-domain validation images (a fresh process)."""
    targets = {"stage1_world": (paths[f"alt-{arm}"], "test"), "in_domain": (paths["domain"], "val")}
    spec = {name: [str(model), str(data), split, run.args.share_images] for name, (data, split) in targets.items()}
    if run.args.in_process:
        return {name: memory_share(Path(m), Path(d), s, n) for name, (m, d, s, n) in spec.items()}
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
    result = subprocess.run([sys.executable, __file__, "--memory-share", json.dumps(spec)], capture_output=True,
                            text=True, env=env)  # fmt: skip
    if result.returncode != 0:
        raise SystemExit(f"memory share of {model} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------------ preparation
def make_worlds(args, work: Path) -> dict[str, Path]:
    """The stage-1 and in-domain data of `--corpus`: `synthetic_worlds` or `clipart_parts`."""
    return clipart_parts(args, work) if args.corpus == "clipart" else synthetic_worlds(args, work)


def synthetic_worlds(args, work: Path) -> dict[str, Path]:
    """The alt-text arms (same seed: the same images) and the in-domain world (train, val, test); an earlier study's
    worlds are reused if they have the split sizes asked for."""
    from itune_hf.data import make_synthetic
    from itune_hf.data.synthetic import CaptionNoise

    worlds = {f"alt-{arm}": ((args.alt_images, 0, args.alt_test_images), 11, "alt-text", arm) for arm in args.arms}
    worlds["domain"] = ((args.finetune_images, args.val_images, args.test_images), 5, args.domain_world, None)
    paths = {}
    for name, (sizes, seed, world, arm) in worlds.items():
        path = paths[name] = work / ("in-domain" if name == "domain" else name) / "dataset.json"
        if path.is_file():
            made = json.loads(path.read_text())["generator"]["split_sizes"]
            if [made["train"], made["val"], made["test"]] != list(sizes):
                raise SystemExit(f"{path} has splits {made}, not {sizes}: use another --work-dir")
            continue
        noise = None if arm is None or ARMS[arm] is None else CaptionNoise(ARMS[arm], ARMS[arm])
        make_synthetic(path.parent, num_images=sum(sizes), seed=seed, split_fractions=sizes, world=world,
                       image_size=args.image_size, caption_noise=noise, overwrite=True)  # fmt: skip
    return paths


def clipart_part(entry: dict, share: float) -> str:
    """Where a clip-art entry goes: its split, with the training split cut into ``finetune`` (about `share` of the
    near-duplicate groups, by a stable hash of the entry's `group`) and ``pretrain``."""
    if entry["split"] != "train":
        return entry["split"]
    digest = hashlib.sha256(f"itune-study-finetune:{entry['group']}".encode()).digest()
    return "finetune" if int.from_bytes(digest[:8], "big") < share * 2**64 else "pretrain"


#: clip-art study data -> the parts it takes, as the split each becomes (stage 1 reads the alt-raw data's `alt_text`:
#: `caption_args`)
CLIPART_DATA = {
    "alt-raw": {"pretrain": "train", "test": "test"},
    "domain": {"finetune": "train", "val": "val", "test": "test"},
}


def clipart_parts(args, work: Path) -> dict[str, Path]:
    """The clip-art corpus cut for the study (the module docstring): `alt-raw/dataset.json` (the pre-training part and
    the test split, whose `alt_text` stage 1 reads) and `in-domain/dataset.json` (the fine-tuning part's clean
    captions, val, test), each beside hard links to the corpus's images (copies across file systems). An earlier
    study's data is reused only if it is the same cut."""
    source = args.clipart.resolve()
    try:
        corpus = json.loads(source.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise SystemExit(f"--clipart {source}: not a readable dataset.json ({error}); make one with "
                         "`itune make-clipart --output-dir DIR`") from None  # fmt: skip
    for index, entry in enumerate(corpus.get("images", [])):
        missing = [f for f in ("group", "alt_text", "split", "filename") if f not in entry]
        if missing:
            raise SystemExit(
                f"--clipart {source}: images[{index}] has no {', '.join(missing)}: not an `itune "
                "make-clipart` dataset.json (make one with `itune make-clipart --output-dir DIR`)"
            )
    parts = [clipart_part(entry, args.finetune_share) for entry in corpus["images"]]
    paths = {}
    for name, takes in CLIPART_DATA.items():
        path = paths[name] = work / ("in-domain" if name == "domain" else name) / "dataset.json"
        entries = [{**e, "split": takes[part]} for e, part in zip(corpus["images"], parts) if part in takes]
        counts = {split: sum(e["split"] == split for e in entries) for split in ("train", "val", "test")}
        cut = {"source": str(source), "finetune_share": args.finetune_share, "images": counts}
        if path.is_file():
            made = json.loads(path.read_text())["study_cut"]
            if made != cut:
                raise SystemExit(f"{path} is the cut {made}, not {cut}: use another --work-dir")
            continue
        link_images(source.parent, path.parent, entries)
        path.write_text(json.dumps({**corpus, "images": entries, "study_cut": cut}))
        print(f"{name}: {cut['images']} images", flush=True)
    return paths


def link_images(source: Path, target: Path, entries: list[dict]) -> None:
    """Hard-link (or copy, across file systems) each entry's image from under `source` to the same place under
    `target`, so that the study's data files read images inside their own folder."""
    for entry in entries:
        relative = Path(entry.get("filepath") or "", entry["filename"])
        destination = target / relative
        if destination.exists():
            continue
        destination.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source / relative, destination)
        except OSError:
            shutil.copy2(source / relative, destination)


def blind_floor(dataset: Path, split: str, grounded_key: str, options: dict | None = None,
                train_images: int = 1000) -> dict:  # fmt: skip
    """The best constant caption and its scores on `split`: of the 300 most frequent captions of the first
    `train_images` training images, the one with the best CIDEr-D on them (a bound on the cost of scoring 300
    candidates on a 4,000-image world); `options`: `load_captions`'s (`caption_options`)."""
    from itune_hf.data import load_captions
    from itune_hf.data.scenes import read_scenes
    from itune_hf.evaluation import constant_caption_floor

    splits = load_captions(dataset, **(options or {}))
    train = splits["train"].select(range(min(train_images, len(splits["train"]))))
    refs = {
        name: dict(zip(rows["image_id"], map(list, rows["captions"])))
        for name, rows in (("train", train), (split, splits[split]))
    }
    floor = constant_caption_floor(refs["train"], refs[split], scenes=read_scenes(dataset), candidates=300)
    return {"caption": floor["caption"], "CIDEr": floor["CIDEr"], grounded_key: floor.get(grounded_key)}


def floors(args, work: Path, paths: dict[str, Path]) -> dict[str, dict]:
    """Each world's blind floor on the split scored there (alt-text: the gate's test split; in-domain: test)."""
    file = work / "floors.json"
    known = json.loads(file.read_text()) if file.is_file() else {}
    for name, path in paths.items():
        if name not in known:
            known[name] = blind_floor(path, "test", args.spec.grounded_key, caption_options(args, name))
    file.write_text(json.dumps(known, indent=1))
    return known


def ready_tower(args, tower: str) -> None:
    """Load `tower`'s preset's vision tower once, as every later step loads it (xgpt-demo-resnet's is pre-trained by the
    package on first use into $ITUNE_CACHE, minutes on a CPU, then reused), so that no start model's seeded draw
    follows that pre-training; and say at what size the worlds' images reach it (its image processor's crop)."""
    from itune_hf.presets import build_image_processor, build_vision_tower

    preset = args.tower_presets[tower]
    build_vision_tower(preset)
    crop = build_image_processor(preset).crop_size
    size = "the corpus's images" if args.corpus == "clipart" else f"the worlds' {args.image_size}-pixel images"
    print(f"tower {tower}: preset {preset}, {size} reach it at {crop['height']}x{crop['width']}", flush=True)


def start_model(args, out: Path, tower: str, seed: int) -> Path:
    """`tower`'s preset's XGPT (its tower as the preset loads it), trainable weights drawn with `seed`."""
    import torch

    from itune_hf.hub import save_captioner
    from itune_hf.presets import build_model, build_processor

    if not (out / "model.safetensors").is_file():
        preset = args.tower_presets[tower]
        torch.manual_seed(seed)
        model = build_model(preset, pretrained=True)
        save_captioner(model, out, processor=build_processor(preset))
    return out


def feature_cache(args, tower: str, start: Path, data: Path, out: Path) -> Path:
    """`data`'s states from `start`'s tower, as `itune train --init-model start` builds it (so that its cache check
    passes), in float32 (the states evaluation computes from the pixels)."""
    from datasets import concatenate_datasets

    from itune_hf.data import load_captions
    from itune_hf.training.config import TrainingConfig
    from itune_hf.training.model import build_training_model
    from itune_hf.vision.feature_cache import cache_features

    if not (out / "fingerprint.json").is_file():
        preset = args.tower_presets[tower]
        config = TrainingConfig(preset=preset, init_model=str(start), data=str(data), output_dir=str(out))
        built = build_training_model(config)
        rows = concatenate_datasets(list(load_captions(str(data)).values()))
        cache_features(rows, out, vision_model=built.base.vision_model, image_processor=built.processor.image_processor,
                       dtype="float32", progress=False)  # fmt: skip
    return out


def prepare(args, work: Path) -> dict:
    """Worlds, floors, start models per (tower, seed) and feature caches per (tower, world)."""
    paths = make_worlds(args, work)
    prepared = {"paths": paths, "floors": floors(args, work, paths), "starts": {}, "caches": {}}
    for tower in args.towers:
        ready_tower(args, tower)
        for seed in args.seed_list:
            prepared["starts"][tower, seed] = start_model(args, work / f"start-{tower}-{seed}", tower, seed)
        for name, data in paths.items():
            start = prepared["starts"][tower, args.seed_list[0]]  # the tower is the same in every seed's start
            prepared["caches"][tower, name] = feature_cache(args, tower, start, data, work / f"cache-{tower}-{name}")
    return prepared


# ------------------------------------------------------------------------------------------------ the steps
def stage1_iterations(args, condition: str) -> int:
    tasks, _ = STAGE1[condition]
    return max(1, args.stage1_updates // len(tasks))


def stage1_job(run: Runner, prep: dict, tower: str, arm: str, condition: str, seed: int) -> dict:
    """Stage 1 on the arm's alt-text, its top-4 average, the gate's scores and the memory shares."""
    args, work = run.args, run.args.work_dir
    tasks, extra = STAGE1[condition]
    name = f"alt-{arm}"
    data, cache, columns = prep["paths"][name], prep["caches"][tower, name], caption_args(args, name)
    out, iterations = work / f"pre-{tower}-{arm}-{condition}-{seed}", stage1_iterations(args, condition)
    start = prep["starts"][tower, seed]
    trained = train(run, out, tower, data, cache, iterations, seed, args.stage1_lr, "--init-model", start,
                    "--tasks", ",".join(tasks), *extra, *columns, checkpoints=4)  # fmt: skip
    model = averaged(run, trained)
    scores = evaluate(run, model, data, "test", work / f"eval-{model.name}", *columns)
    grounded, why = gate_decision(scores, prep["floors"][f"alt-{arm}"]["CIDEr"])
    row = {"kind": "stage1", "tower": tower, "arm": arm, "condition": condition, "seed": seed, "model": str(model),
           "updates": iterations * len(tasks), **scores, "grounded": grounded, "why": why,
           "memory_share": memory_shares(run, model, prep["paths"], arm)}  # fmt: skip
    return run.record(row)


def start_job(run: Runner, prep: dict, tower: str, seed: int) -> dict:
    """The memory shares of the start model (untrained): `none`'s, and the reference the others move from."""
    model = prep["starts"][tower, seed]
    row = {"kind": "start", "tower": tower, "arm": "-", "condition": "none", "seed": seed, "model": str(model),
           "memory_share": memory_shares(run, model, prep["paths"], run.args.arms[0])}  # fmt: skip
    return run.record(row)


def stage2_job(run: Runner, prep: dict, tower: str, arm: str, seed: int, start: Path) -> dict:
    """Stage 2 in-domain (all four tasks, IC 1, the others 0.3) from `all`'s stage 1, and its top-4 average."""
    args, work = run.args, run.args.work_dir
    iterations = max(1, args.stage2_updates // len(ALL_FOUR))
    trained = train(run, work / f"pre-{tower}-{arm}-stage2-{seed}", tower, prep["paths"]["domain"],
                    prep["caches"][tower, "domain"], iterations, seed, args.stage1_lr, "--init-model", start,
                    "--tasks", ",".join(ALL_FOUR), "--task-weights", STAGE2_WEIGHTS, checkpoints=4)  # fmt: skip
    model = averaged(run, trained)
    row = {
        "kind": "stage2",
        "tower": tower,
        "arm": arm,
        "condition": "two-stage",
        "seed": seed,
        "model": str(model),
        "updates": iterations * len(ALL_FOUR),
        "memory_share": memory_shares(run, model, prep["paths"], arm),
    }
    return run.record(row)


def finetune_job(run: Runner, prep: dict, chain: tuple, start: Path, steps: int, lr: float) -> dict:
    """Fine-tune `chain` = (tower, arm, condition, seed) from `start` at `lr` and score the validation split."""
    tower, arm, condition, seed = chain
    out = run.args.work_dir / f"ft-{tower}-{arm}-{condition}-{seed}-lr{lr:g}"
    train(run, out, tower, prep["paths"]["domain"], prep["caches"][tower, "domain"], steps, seed, lr, "--init-model",
          start)  # fmt: skip
    scores = evaluate(run, out, prep["paths"]["domain"], "val", run.args.work_dir / f"eval-{out.name}", control=False)
    row = {"kind": "finetune", "tower": tower, "arm": arm, "condition": condition, "seed": seed, "lr": lr,
           "updates": steps, "model": str(out), **scores}  # fmt: skip
    return run.record(row)


def test_job(run: Runner, prep: dict, chain: tuple, val_rows: list[dict]) -> dict:
    """Score the test split once, with the learning rate the validation split chose; drop the chain's models."""
    tower, arm, condition, seed = chain
    best = choose_lr(val_rows)
    out = run.args.work_dir / f"eval-test-{tower}-{arm}-{condition}-{seed}"
    scores = evaluate(run, Path(best["model"]), prep["paths"]["domain"], "test", out)
    for row in val_rows:
        shutil.rmtree(row["model"], ignore_errors=True)
    row = {"kind": "test", "tower": tower, "arm": arm, "condition": condition, "seed": seed, "lr": best["lr"],
           "val_CIDEr": best["CIDEr"], **scores}  # fmt: skip
    return run.record(row)


# ------------------------------------------------------------------------------------------------ the schedule
def in_parallel(run: Runner, jobs: list) -> None:
    """Run `jobs` (callables), `--jobs` at once (threads that each wait on `itune` processes)."""
    from concurrent.futures import ThreadPoolExecutor

    if run.args.in_process or run.args.jobs <= 1:
        for job in jobs:
            job()
        return
    with ThreadPoolExecutor(max_workers=run.args.jobs) as pool:
        for future in [pool.submit(job) for job in jobs]:
            future.result()


def chains(args) -> list[tuple]:
    """Every (tower, arm, condition, seed) the study fine-tunes (`none` once per tower and seed: arm "-")."""
    out = []
    for tower in args.towers:
        for seed in args.seed_list:
            out += [(tower, "-" if c == "none" else arm, c, seed) for c in args.conditions
                    for arm in (["-"] if c == "none" else args.arms)]  # fmt: skip
    return list(dict.fromkeys(out))


def key(row: dict) -> tuple:
    """What a results row is the result of: its kind and chain, and a fine-tuning run's learning rate."""
    lr = row["lr"] if row["kind"] == "finetune" else None  # (a test row's lr is the chosen one)
    return row["kind"], row["tower"], row["arm"], row["condition"], row["seed"], lr


class Study:
    """The steps of one study: what the results file already holds (`done`, by `key`) and the phases that run the
    rest, each phase's steps in parallel: start shares, stage 1 and its gate, stage 2, fine-tuning at every learning
    rate, the test split."""

    def __init__(self, run: Runner, prep: dict, rows: list[dict]) -> None:
        self.run, self.prep, self.args = run, prep, run.args
        self.done = {key(r): r for r in rows}

    def seen(self, kind: str, chain: tuple, lr: float | None = None) -> dict | None:
        return self.done.get((kind, *chain, lr))

    def launch(self, jobs: list) -> None:
        """Run `jobs` (callables returning a recorded row) and remember their rows."""

        def collected(job):
            row = job()
            self.done[key(row)] = row

        in_parallel(self.run, [lambda job=job: collected(job) for job in jobs])

    def run_all(self) -> None:
        run, prep, args = self.run, self.prep, self.args
        self.launch([lambda t=t, s=s: start_job(run, prep, t, s) for t in args.towers for s in args.seed_list
                     if not self.seen("start", (t, "-", "none", s))])  # fmt: skip
        needed = sorted({(t, a, STAGE1_OF[c], s) for t, a, c, s in chains(args) if c != "none"})
        self.launch([lambda n=n: stage1_job(run, prep, *n) for n in needed if not self.seen("stage1", n)])
        starts = self.finetuning_starts()
        steps = {c: args.finetune_updates - (args.stage2_updates if c[2] == "two-stage" else 0) for c in starts}
        self.launch([lambda c=c, lr=lr: finetune_job(run, prep, c, starts[c], steps[c], lr) for c in starts
                     for lr in args.lrs if not self.seen("test", c) and not self.seen("finetune", c, lr)])  # fmt: skip
        self.launch([lambda c=c: test_job(run, prep, c, [self.seen("finetune", c, lr) for lr in args.lrs])
                     for c in starts if not self.seen("test", c)])  # fmt: skip

    def finetuning_starts(self) -> dict[tuple, Path]:
        """The model each chain fine-tunes from: the start model (none), a grounded stage 1's average (one stage), or
        stage 2's average after it (two-stage, run here). A chain whose stage 1 did not ground gets none (recorded as
        "ungrounded") unless --gate report."""
        starts = {}
        for chain in chains(self.args):
            tower, arm, condition, seed = chain
            if condition == "none":
                starts[chain] = self.prep["starts"][tower, seed]
                continue
            stage1 = self.seen("stage1", (tower, arm, STAGE1_OF[condition], seed))
            if stage1["grounded"] or self.args.gate == "report":
                starts[chain] = Path(stage1["model"])
            elif not self.seen("ungrounded", chain):
                row = {"kind": "ungrounded", "tower": tower, "arm": arm, "condition": condition, "seed": seed}
                self.done[key(row)] = self.run.record({**row, "why": stage1["why"]})
        two_stage = [c for c in starts if c[2] == "two-stage"]
        self.launch([lambda c=c: stage2_job(self.run, self.prep, c[0], c[1], c[3], starts[c]) for c in two_stage
                     if not self.seen("stage2", c)])  # fmt: skip
        return {**starts, **{c: Path(self.seen("stage2", c)["model"]) for c in two_stage}}


# ------------------------------------------------------------------------------------------------ the table
def _pct(value) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{100 * value:.1f}"


def _mean_sd(rows: list[dict], key_: str) -> str:
    values = [r.get(key_) for r in rows]
    if not values or any(v is None for v in values):
        return "-"
    mean = 100 * statistics.mean(values)
    return f"{mean:.1f} ± {100 * statistics.stdev(values):.1f}" if len(values) > 1 else f"{mean:.1f}"


def _stage1_cell(stage1: list[dict], floor: dict | None) -> str:
    """Stage 1 on alt-text: CIDEr (shuffled), distinct captions, per seed; the floor; grounded seeds."""
    if not stage1:
        return "-"
    seeds = ", ".join(f"{_pct(r['CIDEr'])} ({_pct(r['CIDEr_shuffled'])}), {r['distinct_captions']}/{r['images']}"
                      for r in stage1)  # fmt: skip
    grounded = sum(r["grounded"] for r in stage1)
    return f"{seeds}; floor {_pct(floor and floor['CIDEr'])}; grounded {grounded}/{len(stage1)}"


def _share_cell(rows: list[dict]) -> str:
    shares = [r["memory_share"] for r in rows if r.get("memory_share")]
    if not shares:
        return "-"
    return " / ".join(f"{statistics.mean(s[name] for s in shares):.2f}" for name in ("stage1_world", "in_domain"))


def table(results: list[dict], floors_: dict | None = None, corpus: Corpus = CORPORA["synthetic"]) -> str:
    """One row per (tower, arm, condition): stage 1 and its gate, the memory share of the start of fine-tuning,
    the chosen learning rates, test CIDEr / grounded F1 / shuffled control, and the paired differences from none."""
    floors_, f1, f1_title = floors_ or {}, corpus.grounded_key, corpus.grounded_title
    latest = {key(r): r for r in results}  # a step recorded twice counts once
    by = {}
    for row in latest.values():
        by.setdefault((row["kind"], row["tower"], row["arm"], row["condition"]), {})[row["seed"]] = row
    lines = ["| tower | stage-1 world | condition | stage 1 on alt-text: CIDEr (shuffled), distinct/images per seed | "
             "memory share of the fine-tuning start (alt-text / in-domain) | chosen LR per seed | seeds | CIDEr | "
             f"{f1_title} | CIDEr, shuffled | {f1_title}, shuffled | Δ CIDEr vs none (mean ± sd, n) | "
             f"Δ {f1_title} vs none | pre-training |", "|---" * 14 + "|"]  # fmt: skip
    groups = sorted(
        {k[1:] for k in by if k[0] in ("test", "ungrounded")},
        key=lambda g: (g[0], g[1] != "-", g[1], CONDITIONS.index(g[2])),
    )  # none first
    for tower, arm, condition in groups:
        tests = by.get(("test", tower, arm, condition), {})
        stage1 = list(by.get(("stage1", tower, arm, STAGE1_OF[condition]), {}).values())
        share_kind = {"none": "start", "two-stage": "stage2"}.get(condition, "stage1")
        shares = list(by.get((share_kind, tower, arm, condition), {}).values())
        stage1_text = _stage1_cell(stage1, floors_.get(f"alt-{arm}"))
        if not tests:
            why = "; ".join(sorted({r["why"] for r in stage1 if not r["grounded"]}))
            lines.append(f"| {tower} | {arm} | {TITLES[condition]} | {stage1_text} | {_share_cell(shares)} | - | 0 | "
                         f"stage 1 did not ground ({why}) |" + " - |" * 6)  # fmt: skip
            continue
        rows = [tests[s] for s in sorted(tests)]
        lrs = ", ".join(f"{r['lr']:g}" for r in rows)
        cells = " | ".join(_mean_sd(rows, k) for k in ("CIDEr", f1, "CIDEr_shuffled", f"{f1}_shuffled"))
        diff = "- | - | -"
        if condition != "none":
            base = by.get(("test", tower, "-", "none"), {})
            (c, c_sd, n), (f, f_sd, _) = (paired_difference(tests, base, k) for k in ("CIDEr", f1))
            ungrounded = sorted(r["seed"] for r in stage1 if not r["grounded"])
            note = f"; stage 1 did not ground for seeds {ungrounded} (--gate report)" if ungrounded else ""
            verdicts = f"CIDEr: {verdict(c, c_sd, n)}; {f1_title}: {verdict(f, f_sd, n)}"
            diff = f"{c:+.1f} ± {c_sd:.1f} ({n}) | {f:+.1f} ± {f_sd:.1f} | {verdicts}{note}"
        lines.append(f"| {tower} | {arm} | {TITLES[condition]} | {stage1_text} | {_share_cell(shares)} | {lrs} | "
                     f"{len(rows)} | {cells} | {diff} |")  # fmt: skip
    domain = floors_.get("domain")
    if domain:
        lines.append(f"\nIn-domain blind floor (\"{domain['caption']}\" for every test image): CIDEr "
                     f"{_pct(domain['CIDEr'])}, {f1_title} {_pct(domain.get(f1))}.")  # fmt: skip
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ arguments
def listed(value: str, kind=str) -> list:
    return [kind(v) for v in value.split(",") if v]


#: --tiny: what it changes (sizes and models; the factors keep any value given on the command line)
TINY = {
    "image_size": 64,  # the ResNet stand-in's input, as the study's
    "alt_images": 24,
    "alt_test_images": 8,
    "finetune_images": 8,
    "val_images": 4,
    "test_images": 4,
    "stage1_updates": 8,
    "stage2_updates": 4,
    "finetune_updates": 6,
    "batch_size": 4,
    "share_images": 4,
    "in_process": True,
}
TINY_FACTORS = {"towers": "pretrained", "arms": "clean", "conditions": "none,two-stage", "seeds": 2,
                "finetune_lrs": "1e-3,1e-2", "gate": "report"}  # fmt: skip
FACTORS = {"towers": "pretrained,random", "arms": "clean,noisy", "conditions": "none,ic,all,two-stage", "seeds": 3,
           "finetune_lrs": "1e-5,1e-4,1e-3", "gate": "on"}  # fmt: skip
#: --corpus clipart: its factors' defaults (where a flag is not given; --tiny's smoke run takes its own)
CLIPART_FACTORS = {"towers": "lite0", "arms": "raw", "conditions": "none,ic"}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--work-dir", type=Path, default=Path("outputs/study-pretrain"))
    add("--results", type=Path, default=None, help="JSON lines, appended to (default: WORK_DIR/results.jsonl)")
    add("--resume", action="store_true", help="continue the study --results holds (else an existing file is refused)")
    add("--table-only", action="store_true", help="print the table of --results and stop")
    add(
        "--tiny",
        action="store_true",
        help="smoke run: tiny models, a few images and updates, in this process (with --jobs: fresh processes)",
    )
    add("--towers", default=None, help=f"of {', '.join(TOWERS)} (default {FACTORS['towers']})")
    add("--arms", default=None, help=f"alt-text arms, of {', '.join(ARMS)} (default {FACTORS['arms']})")
    add("--conditions", default=None, help=f"of {', '.join(CONDITIONS)} (default {FACTORS['conditions']})")
    add("--seeds", type=int, default=None, help="paired seeds 0 .. N-1 (default 3)")
    add("--finetune-lrs", default=None, help="the grid the validation split chooses from (default 1e-5,1e-4,1e-3)")
    add(
        "--gate",
        choices=("on", "report"),
        default=None,
        help="on (default): fine-tune only from a grounded stage 1; report (--tiny's): all, ungrounded ones labelled",
    )
    add(
        "--corpus",
        choices=tuple(CORPORA),
        default="synthetic",
        help="synthetic (default): the generated worlds; "
        "clipart: `itune make-clipart`'s corpus (--clipart), its alt-text arm and clean captions (module docstring)",
    )
    add("--clipart", type=Path, default=Path("outputs/clipart/dataset.json"), help="--corpus clipart: its dataset.json")
    add("--finetune-share", type=float, default=0.1,
        help="--corpus clipart: the share of the training split's near-duplicate groups fine-tuned on")  # fmt: skip
    add("--domain-world", choices=("captions", "hard"), default="captions")
    add("--image-size", type=int, default=64)
    add("--alt-images", type=int, default=4000, help="alt-text training images (5 captions each)")
    add("--alt-test-images", type=int, default=200, help="alt-text test images: the gate's split")
    add("--finetune-images", type=int, default=100, help="in-domain training images (low resource: 50-200)")
    add("--val-images", type=int, default=100)
    add("--test-images", type=int, default=200)
    add("--stage1-updates", type=int, default=2400, help="optimizer updates of stage 1, each task's counted")
    add("--stage2-updates", type=int, default=100, help="two-stage: in-domain updates of stage 2 (of the total)")
    add("--finetune-updates", type=int, default=300, help="in-domain updates of every condition")
    add("--stage1-lr", type=float, default=1e-3)
    add("--batch-size", type=int, default=16)
    add("--mixed-precision", default="no", help="no (fp32), bf16, ...: every itune train")
    add("--share-images", type=int, default=50, help="images the memory share is measured on")
    add("--jobs", type=int, default=1, help="steps at once, each a fresh process (a GPU run: 8)")
    add("--threads", type=int, default=None, help="OMP threads per process")
    add("--in-process", action="store_true", help="run every command in this process (one at a time)")
    add("--memory-share", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    given = {k for k, v in vars(args).items() if v != parser.get_default(k)}
    if args.tiny:  # in this process, unless --jobs asks for fresh processes (as the full study runs)
        for name, value in TINY.items():
            if name not in given and not (name == "in_process" and "jobs" in given):
                setattr(args, name, value)
    corpus_factors = CLIPART_FACTORS if args.corpus == "clipart" else {}
    for name, value in {**(TINY_FACTORS if args.tiny else FACTORS), **corpus_factors}.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return check_args(parser, args)


def check_args(parser, args):
    args.towers, args.arms, args.conditions = listed(args.towers), listed(args.arms), listed(args.conditions)
    args.lrs, args.seed_list = listed(args.finetune_lrs, float), list(range(args.seeds))
    args.spec = CORPORA[args.corpus]
    factors = (("--towers", args.towers, tuple(args.spec.towers)), ("--arms", args.arms, args.spec.arms),
               ("--conditions", args.conditions, CONDITIONS))  # fmt: skip
    for flag, given, known in factors:
        unknown = sorted(set(given) - set(known))
        if unknown:
            parser.error(f"{flag}: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
    if args.stage1_updates <= args.finetune_updates:  # (one batch size for every run: updates count captions)
        parser.error(f"--stage1-updates {args.stage1_updates} must exceed --finetune-updates "
                     f"{args.finetune_updates}: stage 1 must see more captions than fine-tuning")  # fmt: skip
    if "two-stage" in args.conditions and args.stage2_updates >= args.finetune_updates:
        parser.error("--stage2-updates must be under --finetune-updates (two-stage fine-tunes the rest)")
    check_equal_updates(parser, args)
    if not 0 < args.finetune_share < 1:
        parser.error(f"--finetune-share {args.finetune_share}: give a share between 0 and 1 (e.g. 0.1)")
    args.tower_presets = args.spec.tiny_towers if args.tiny else args.spec.towers
    args.work_dir = args.work_dir.resolve()
    args.results = (args.results or args.work_dir / "results.jsonl").resolve()
    return args


def check_equal_updates(parser, args) -> None:
    """Refuse update counts that the alternating schedules cannot split evenly: a condition of k tasks makes
    `updates // k` iterations of k updates, so any remainder would give it fewer updates than the others."""
    tasks = {len(STAGE1[c][0]) for c in args.conditions if STAGE1[c][0]}
    multiple = math.lcm(*tasks) if tasks else 1
    if args.stage1_updates % multiple:
        parser.error(f"--stage1-updates {args.stage1_updates} is not a multiple of {multiple} (conditions of "
                     f"{', '.join(map(str, sorted(tasks)))} tasks alternate): the conditions would get unequal "
                     f"updates; pass a multiple of {multiple}")  # fmt: skip
    if "two-stage" in args.conditions and args.stage2_updates % len(ALL_FOUR):
        parser.error(f"--stage2-updates {args.stage2_updates} is not a multiple of {len(ALL_FOUR)} (stage 2 "
                     f"alternates the four tasks): two-stage would get fewer in-domain updates than the others; "
                     f"pass a multiple of {len(ALL_FOUR)}")  # fmt: skip


def read_results(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.memory_share:
        spec = json.loads(args.memory_share)
        print(json.dumps({name: memory_share(Path(m), Path(d), s, n) for name, (m, d, s, n) in spec.items()}))
        return 0
    rows = read_results(args.results)
    if not args.table_only:
        if rows and not args.resume:
            raise SystemExit(f"{args.results} holds {len(rows)} results: pass --resume to continue that study, or "
                             "another --work-dir / --results")  # fmt: skip
        sys.path.insert(0, str(ROOT))
        args.work_dir.mkdir(parents=True, exist_ok=True)
        started = time.time()
        prep = prepare(args, args.work_dir)
        Study(Runner(args), prep, rows).run_all()
        print(f"study done in {time.time() - started:.0f} s", flush=True)
        rows = read_results(args.results)
    floors_file = args.work_dir / "floors.json"
    print(table(rows, json.loads(floors_file.read_text()) if floors_file.is_file() else None, CORPORA[args.corpus]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

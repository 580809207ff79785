"""`benchmarks/study_xgpt_pretraining.py`: the grounding gate, the paired differences, the steps each chain runs (equal
updates, one start per seed, the learning rate chosen on validation, the test split scored once) and resumption, with
the `itune` commands recorded instead of run (the commands themselves are tested in test_xgpt_pretraining.py)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from script_support import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "study_xgpt_pretraining.py"


@pytest.fixture(scope="module")
def module():
    loaded = load_script(SCRIPT, register=True)  # its dataclasses look their module up there
    yield loaded
    sys.modules.pop(loaded.__name__, None)


def test_the_gate_passes_only_a_stage_1_that_beats_floor_and_control_with_many_captions(module):
    grounded = {"CIDEr": 0.60, "CIDEr_shuffled": 0.20, "distinct_captions": 30, "images": 100}
    assert module.gate_decision(grounded, floor_cider=0.40) == (True, "")
    ok, why = module.gate_decision({**grounded, "CIDEr": 0.43}, floor_cider=0.40)  # above, but not by the margin
    assert not ok and why == "CIDEr 43.0 not 5 above the blind floor 40.0"
    ok, why = module.gate_decision({**grounded, "CIDEr_shuffled": 0.58}, floor_cider=0.40)  # blind to its image
    assert not ok and why == "CIDEr 60.0 not 5 above shuffled images 58.0"
    ok, why = module.gate_decision({**grounded, "distinct_captions": 19}, floor_cider=0.40)  # under a fifth
    assert not ok and why == "19 distinct captions for 100 images"
    one_caption = {"CIDEr": 0.1, "CIDEr_shuffled": 0.1, "distinct_captions": 1, "images": 100}
    assert module.gate_decision(one_caption, floor_cider=0.40)[1].count(";") == 2  # every reason named


def test_paired_differences_are_per_seed_and_the_verdict_needs_two_standard_deviations(module):
    none = {0: {"CIDEr": 0.50}, 1: {"CIDEr": 0.60}, 2: {"CIDEr": 0.70}, 3: {"CIDEr": 0.1}}
    pre = {0: {"CIDEr": 0.70}, 1: {"CIDEr": 0.85}, 2: {"CIDEr": 1.00}}  # +20, +25, +30: seed 3 has no pair
    mean, sd, n = module.paired_difference(pre, none, "CIDEr")
    assert (round(mean, 6), round(sd, 6), n) == (25.0, 5.0, 3)
    assert module.verdict(mean, sd, n) == "helps"  # 25 > 2 x 5
    assert module.verdict(-25.0, 5.0, 3) == "hurts"
    assert module.verdict(-8.0, 5.0, 3) == "no claim"  # beyond two standard errors (5.77), within two sd (10)
    assert module.verdict(-0.0, 0.0, 3) == "no claim" and module.verdict(-30.0, 1.0, 2) == "no claim (under 3 seeds)"
    assert math.isnan(module.paired_difference(pre, {}, "CIDEr")[0])
    assert (
        module.choose_lr([{"lr": 1e-5, "CIDEr": 0.2}, {"lr": 1e-4, "CIDEr": 0.3}, {"lr": 1e-3, "CIDEr": 0.3}])["lr"]
        == 1e-4
    )  # the best on validation, the smaller rate on a tie


# ------------------------------------------------------------------------------------------------ the whole study
def fake_scores(out: str, images: int = 8) -> tuple[dict, list[str]]:
    """What `itune eval` reports for the run an output directory names: stage 1 with IC grounds, all four does not;
    the validation split prefers 1e-4; on the test split IC-only beats none by 20, 25, 30 over seeds 0, 1, 2."""
    if out.startswith("eval-pre-"):
        grounded = "-ic-" in out
        scores = {"CIDEr": 2.0 if grounded else 0.0, "CIDEr (shuffled)": 0.1 if grounded else 0.0}
        return scores, [f"caption {i if grounded else 0}" for i in range(images)]
    if out.startswith("eval-ft-"):
        return {"CIDEr": 1.0 if "lr0.0001" in out else 0.5}, ["a"] * images
    seed = int(out.rsplit("-", 1)[1])
    cider = 0.5 + 0.1 * seed + (0.2 + 0.05 * seed if "-ic-" in out else 0.0)
    return {"CIDEr": cider, "Object_F1": 0.3, "CIDEr (shuffled)": 0.1, "Object_F1 (shuffled)": 0.05}, ["a", "b"]


@pytest.fixture
def study(module, monkeypatch):
    calls: list[list[str]] = []

    def fake_itune(self, *args) -> str:  # what each command leaves behind
        args = [str(a) for a in args]
        calls.append(args)
        out = Path(args[args.index("--output-dir") + 1])
        out.mkdir(parents=True, exist_ok=True)
        if args[0] in ("train", "average-checkpoints"):
            (out / "model.safetensors").write_text("")
            steps = int(args[args.index("--max-steps") + 1]) if args[0] == "train" else 0
            (out / "train_summary.json").write_text(json.dumps({"steps": steps}))
            if args[0] == "train":
                (out / "checkpoints" / "step-1").mkdir(parents=True)
        elif args[0] == "eval":
            scores, captions = fake_scores(out.name)
            (out / "captions.jsonl").write_text("".join(json.dumps({"caption": c}) + "\n" for c in captions))
            return json.dumps(scores) + "\n"
        return ""

    def placeholder(args, out, *rest):
        Path(out).mkdir(parents=True, exist_ok=True)
        return Path(out)

    monkeypatch.setattr(module.Runner, "itune", fake_itune)
    monkeypatch.setattr(module, "start_model", placeholder)  # the tiny models and caches: not needed here
    monkeypatch.setattr(module, "feature_cache", lambda args, tower, start, data, out: placeholder(args, out))
    monkeypatch.setattr(module, "ready_tower", lambda args, tower: None)
    monkeypatch.setattr(module, "memory_shares", lambda run, model, paths, arm: {"stage1_world": 0.4, "in_domain": 0.5})
    module.calls = calls
    yield module
    module.calls = []


def run_study(module, work: Path, *extra: str, towers: str = "random") -> None:
    factors = ["--towers", towers, "--arms", "clean", "--conditions", "none,ic,all,two-stage", "--seeds", "3",
               "--finetune-lrs", "1e-5,1e-4,1e-3", "--gate", "on"]  # fmt: skip
    module.main(["--tiny", "--work-dir", str(work), *factors, "--stage1-updates", "12", "--finetune-updates", "6",
                 *extra])  # fmt: skip


def trains(calls, prefix: str) -> list[list[str]]:
    return [c for c in calls if c[0] == "train" and Path(c[c.index("--output-dir") + 1]).name.startswith(prefix)]


def option(call: list[str], flag: str) -> str:
    return call[call.index(flag) + 1]


@pytest.mark.slow  # the worlds and their floors: seconds
def test_every_chain_gets_equal_updates_one_start_and_a_learning_rate_chosen_on_validation(study, tmp_path, capsys):
    run_study(study, tmp_path)
    work = tmp_path.resolve()
    ic, all_four = trains(study.calls, "pre-random-clean-ic-"), trains(study.calls, "pre-random-clean-all-")
    assert [option(c, "--max-steps") for c in ic] == ["12"] * 3  # 12 updates: one task
    assert [option(c, "--max-steps") for c in all_four] == ["3"] * 3  # 12 updates: 3 iterations of four tasks
    assert option(all_four[0], "--tasks") == "ic,imlm,ida,tifg" and option(ic[0], "--tasks") == "ic"
    for seed in range(3):
        start = str(work / f"start-random-{seed}")
        none = trains(study.calls, f"ft-random---none-{seed}-")
        assert [option(c, "--init-model") for c in none] == [start] * 3  # none starts where stage 1 starts
        assert option(ic[seed], "--init-model") == start and option(ic[seed], "--seed") == str(seed)
        assert {option(c, "--seed") for c in none} == {str(seed)}  # same data order in every condition
        finetuned = trains(study.calls, f"ft-random-clean-ic-{seed}-")
        assert [option(c, "--learning-rate") for c in finetuned] == ["1e-05", "0.0001", "0.001"]
        assert {option(c, "--max-steps") for c in none + finetuned} == {"6"}  # equal fine-tuning updates
        assert {option(c, "--init-model") for c in finetuned} == {str(work / f"pre-random-clean-ic-{seed}-top4")}
    assert not trains(study.calls, "ft-random-clean-all-") and not trains(study.calls, "pre-random-clean-stage2")
    tests = [
        c for c in study.calls if c[0] == "eval" and option(c, "--split") == "test" and "ft-" in option(c, "--model")
    ]
    assert sorted(Path(option(c, "--model")).name for c in tests) == sorted(
        f"ft-random-{arm}-{condition}-{seed}-lr0.0001" for arm, condition in (("-", "none"), ("clean", "ic"))
        for seed in range(3)
    )  # fmt: skip  # the test split once per chain, with the rate validation chose
    assert all("--shuffled-control" in c for c in tests)
    assert not list(work.glob("ft-*")) and not list(work.glob("pre-*/checkpoints"))  # scored models are dropped
    table = capsys.readouterr().out
    ic_row = next(line for line in table.splitlines() if "| IC only |" in line)
    assert "| 0.0001, 0.0001, 0.0001 | 3 | 85.0 ± 15.0 | 30.0 ± 0.0 | 10.0 ± 0.0 | 5.0 ± 0.0 |" in ic_row
    assert "+25.0 ± 5.0 (3) | +0.0 ± 0.0 | CIDEr: helps; object F1: no claim |" in ic_row and "grounded 3/3" in ic_row
    assert "| 0.40 / 0.50 |" in ic_row  # the memory shares after stage 1
    for title in ("IC + IMLM + IDA + TIFG", "all four + stage 2 in-domain"):
        row = next(line for line in table.splitlines() if f"| {title} |" in line)
        assert "stage 1 did not ground (CIDEr 0.0 not 5 above the blind floor" in row and "grounded 0/3" in row
    assert "In-domain blind floor" in table


@pytest.mark.slow
def test_a_cut_short_study_resumes_and_a_finished_one_is_not_overwritten(study, tmp_path, capsys):
    run_study(study, tmp_path, "--conditions", "none", "--seeds", "1")
    results = tmp_path / "results.jsonl"
    kinds = [json.loads(line)["kind"] for line in results.read_text().splitlines()]
    assert kinds == ["start", "finetune", "finetune", "finetune", "test"]
    with pytest.raises(SystemExit, match="pass --resume"):
        run_study(study, tmp_path, "--conditions", "none,ic", "--seeds", "1")
    study.calls.clear()
    run_study(study, tmp_path, "--conditions", "none,ic", "--seeds", "1", "--resume")
    assert {Path(option(c, "--output-dir")).name for c in study.calls if c[0] == "train"} == {
        "pre-random-clean-ic-0", "ft-random-clean-ic-0-lr1e-05", "ft-random-clean-ic-0-lr0.0001",
        "ft-random-clean-ic-0-lr0.001",
    }  # fmt: skip  # none's seed 0 was done
    scored = [Path(option(c, "--output-dir")).name for c in study.calls if c[0] == "eval"]
    assert [name for name in scored if name.startswith("eval-test-")] == ["eval-test-random-clean-ic-0"]  # not none's
    with pytest.raises(SystemExit, match="in-domain/dataset.json has splits .* not \\(9, 4, 4\\)"):
        run_study(study, tmp_path, "--conditions", "none", "--seeds", "1", "--finetune-images", "9", "--resume")
    with pytest.raises(SystemExit):
        run_study(study, tmp_path, "--conditions", "none,ic+mlm")
    assert "unknown ic+mlm" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run_study(study, tmp_path, "--stage1-updates", "6")
    assert "stage 1 must see more captions than fine-tuning" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--conditions", "none,ic,ic+tifg", "--stage1-updates", "13"], "--stage1-updates 13 is not a multiple of 2"),
        (["--conditions", "none,all", "--stage1-updates", "14"], "--stage1-updates 14 is not a multiple of 4"),
        (["--conditions", "none,two-stage", "--stage2-updates", "5"], "--stage2-updates 5 is not a multiple of 4"),
    ],
)
def test_update_counts_the_alternating_tasks_cannot_split_evenly_are_refused(module, extra, message, capsys):
    """Every condition must make the same number of updates: 13 stage-1 updates would give IC 13 and IC + TIFG 12 (6
    iterations of 2), 5 stage-2 updates would give two-stage 4 there, one in-domain update fewer than the others."""
    with pytest.raises(SystemExit):
        module.parse_args(["--finetune-updates", "10", "--seeds", "1", *extra])
    assert message in capsys.readouterr().err
    assert module.parse_args(["--conditions", "none,ic,ic+tifg,two-stage", "--stage1-updates", "16",
                              "--stage2-updates", "8", "--finetune-updates", "10"]).stage1_updates == 16  # fmt: skip


@pytest.mark.slow  # the worlds and their floors: seconds
def test_each_tower_trains_over_its_own_preset(study, tmp_path):
    """The pre-trained tower is xgpt-demo-resnet's (its region feature norm and the package's pre-trained ResNet with
    it), the random one xgpt-demo's ViT; --tiny puts tiny random stand-ins of the same kinds in their place."""
    assert study.parse_args([]).tower_presets == {"pretrained": "xgpt-demo-resnet", "random": "xgpt-demo"}
    run_study(study, tmp_path, "--conditions", "none,ic", "--seeds", "1", towers="pretrained,random")
    presets = {(Path(option(c, "--output-dir")).name.split("-")[1], option(c, "--preset"))
               for c in study.calls if c[0] == "train"}  # fmt: skip
    assert presets == {("pretrained", "xgpt-tiny-random-resnet"), ("random", "xgpt-tiny-random")}


def test_both_worlds_reach_the_resnet_at_64_pixels_unresampled(module, tmp_path):
    """The study's alt-text and captions worlds, at its default image size, go through xgpt-demo-resnet's image
    processor pixel for pixel (64x64: no resize, no crop) and give its ResNet architecture an 8x8 grid of cells."""
    import numpy as np
    import torch
    from PIL import Image

    from itune_hf.data import load_captions, make_synthetic
    from itune_hf.presets import build_image_processor, get_preset

    size = module.parse_args([]).image_size
    processor = build_image_processor(module.TOWER_PRESETS["pretrained"])
    tower = get_preset(module.TOWER_PRESETS["pretrained"]).vision.load(pretrained=False, vision=True).eval()
    for world in ("alt-text", "captions"):
        path = make_synthetic(tmp_path / world, num_images=3, seed=11, split_fractions=(3, 0, 0), world=world,
                              image_size=size)  # fmt: skip
        images = [Image.open(p).convert("RGB") for p in load_captions(str(path))["train"]["image_path"]]
        pixels = processor(images=images, return_tensors="pt")["pixel_values"]
        assert tuple(pixels.shape) == (3, 3, 64, 64), world
        mean, std = np.array(processor.image_mean), np.array(processor.image_std)
        restored = pixels.numpy().transpose(0, 2, 3, 1) * std + mean
        assert np.abs(restored * 255 - np.stack([np.asarray(i) for i in images])).max() < 0.5, world
        with torch.no_grad():
            assert tuple(tower(pixel_values=pixels).last_hidden_state.shape) == (3, 128, 8, 8), world


# ------------------------------------------------------------------------------------------------ real alt-text
NOUNS = ["cat", "dog", "flag", "house", "tree", "car", "star", "fish", "bird", "boat", "lamp", "key"]


def tiny_clipart(root: Path, images: int = 60) -> Path:
    """An `itune make-clipart`-shaped corpus: drawings whose clean caption names one noun, whose alt-text adds keywords
    and a file name, in seven near-duplicate groups (series) of 8-9 images each, and a train / val / test split."""
    from PIL import Image, ImageDraw

    entries = []
    for index in range(images):
        noun, group = NOUNS[index % len(NOUNS)], f"misc/series_{index % 7}"
        image = Image.new("RGB", (32, 32), "white")
        ImageDraw.Draw(image).rectangle([index % 9, index % 7, 20 + index % 11, 20], fill=(20 * (index % 12), 90, 160))
        (root / "images" / "misc").mkdir(parents=True, exist_ok=True)
        image.save(root / "images" / "misc" / f"{index}.png")
        split = "test" if index % 5 == 0 else "val" if index % 5 == 1 else "train"
        entries.append({
            "filepath": "images/misc", "filename": f"{index}.png", "image_id": f"misc/{index}", "split": split,
            "sentences": [{"raw": f"A {noun}.", "imgid": index, "sentid": index}],
            "alt_text": f"{noun}, clipart, drawing, misc {noun} {index:03d}", "content_words": [noun], "group": group,
        })  # fmt: skip
    path = root / "dataset.json"
    path.write_text(json.dumps({"dataset": "itune-clipart", "images": entries}))
    return path


def test_the_clipart_cut_keeps_groups_whole_and_pretrains_on_alt_text_only(module, tmp_path):
    """--corpus clipart: the fine-tuning part and the pre-training part split the training split by near-duplicate
    group (never one group in both), stage 1's captions are the alt-text, fine-tuning's the clean captions, and the
    images sit inside each data file's folder (hard links)."""
    from itune_hf.data import load_captions

    source = tiny_clipart(tmp_path / "corpus")
    args = module.parse_args(["--corpus", "clipart", "--clipart", str(source), "--finetune-share", "0.3",
                              "--work-dir", str(tmp_path / "work"), "--seeds", "1"])  # fmt: skip
    assert (args.towers, args.arms, args.conditions, args.tower_presets) == (
        ["lite0"],
        ["raw"],
        ["none", "ic"],
        {"lite0": "xgpt-lite0"},
    )
    paths = module.make_worlds(args, args.work_dir)
    alt = load_captions(str(paths["alt-raw"]), **module.caption_options(args, "alt-raw"))
    domain = load_captions(str(paths["domain"]), **module.caption_options(args, "domain"))
    entries = {e["image_id"]: e for e in json.loads(source.read_text())["images"]}
    groups = {name: {entries[i]["group"] for i in data["train"]["image_id"]}
              for name, data in (("alt", alt), ("domain", domain))}  # fmt: skip
    train_ids = {i for i, e in entries.items() if e["split"] == "train"}
    assert not groups["alt"] & groups["domain"]  # no group, so no near-duplicate, in both parts
    assert set(alt["train"]["image_id"]) | set(domain["train"]["image_id"]) == train_ids
    assert 0 < len(domain["train"]) < len(alt["train"])
    assert all(c[0].startswith(("cat,", "dog,", "flag,", "house,", "tree,", "car,", "star,", "fish,", "bird,",
                                "boat,", "lamp,", "key,")) for c in alt["train"]["captions"])  # fmt: skip
    assert all(c[0].startswith("A ") for c in domain["train"]["captions"])
    assert set(alt["test"]["image_id"]) == set(domain["test"]["image_id"]) and "val" not in alt
    assert all(Path(p).is_file() and str(args.work_dir) in p for p in domain["val"]["image_path"])
    with pytest.raises(SystemExit, match="is the cut .* not"):  # another share, same work dir: refused
        module.make_worlds(module.parse_args(["--corpus", "clipart", "--clipart", str(source), "--finetune-share",
                                              "0.5", "--work-dir", str(tmp_path / "work")]), args.work_dir)  # fmt: skip
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"images": [{"filename": "a.png", "split": "train"}]}))
    with pytest.raises(SystemExit, match="images\\[0\\] has no group, alt_text: not an `itune make-clipart`"):
        module.make_worlds(module.parse_args(["--corpus", "clipart", "--clipart", str(bad)]), tmp_path / "w2")


@pytest.mark.slow  # tiny models on a tiny corpus: about 30 s
def test_the_clipart_study_runs_end_to_end_on_tiny_models(module, tmp_path, capsys):
    """The whole study on a tiny corpus, every `itune` command run for real: stage 1 trains on the alt-text, the table
    reports the content words named (words F1) and the paired difference of IC from none."""
    source = tiny_clipart(tmp_path / "corpus")
    module.main(["--tiny", "--corpus", "clipart", "--clipart", str(source), "--work-dir", str(tmp_path / "work"),
                 "--finetune-share", "0.3", "--seeds", "1", "--conditions", "none,ic",
                 "--finetune-lrs", "1e-3"])  # fmt: skip
    rows = [json.loads(line) for line in (tmp_path / "work" / "results.jsonl").read_text().splitlines()]
    tests = [r for r in rows if r["kind"] == "test"]
    assert sorted(r["condition"] for r in tests) == ["ic", "none"]
    assert all(0 <= r["Words_F1"] <= 1 and "Words_F1_shuffled" in r for r in tests)
    table = capsys.readouterr().out
    commands = [line for line in table.splitlines() if line.startswith(("$ itune train", "$ itune eval"))]
    stage1 = [c for c in commands if "/alt-raw/" in c]
    assert len(stage1) == 2 and all(c.endswith("--caption-column alt_text") or "--caption-column alt_text " in c
                                    for c in stage1)  # fmt: skip  # stage 1 and its gate read the alt-text
    assert not any("--caption-column" in c for c in commands if c not in stage1)  # fine-tuning: clean captions
    assert "| words F1 | CIDEr, shuffled | words F1, shuffled |" in table and "| lite0 | raw | IC only |" in table
    assert "In-domain blind floor" in table and "words F1" in table.split("In-domain blind floor")[1]

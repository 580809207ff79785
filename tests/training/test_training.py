"""Training as users run it: `itune train`, `accelerate launch` with 2 processes, kill-and-resume, feature caches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from itune_hf import ITuningForCaptioning, build_model, build_processor
from itune_hf.data import load_captions, make_synthetic
from itune_hf.training import TrainingConfig
from itune_hf.vision.feature_cache import FeatureCache, FeatureCacheMismatch, cache_features

from conftest import free_port, kill_once_checkpointed

pytestmark = pytest.mark.slow  # learning runs, subprocesses, kills or benchmarks: only make test-slow runs them

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]
TINY = ["--preset", "itune-tiny-random", "--batch-size", "4", "--report-to", "none", "--learning-rate", "1e-2"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("world")
    make_synthetic(root / "data", num_images=40, seed=3, image_size=32)
    return root / "data" / "dataset.json"


def itune(*args, cwd=None, timeout=600, env=None):
    return subprocess.run(
        [str(BIN / "itune"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )


def adapter_weights(directory: Path) -> dict[str, torch.Tensor]:
    return load_file(directory / "adapter_model.safetensors")


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_itune_train_saves_an_adapter_that_loads_and_captions(world, tmp_path):
    out = tmp_path / "run"
    result = itune(
        "train",
        "--output-dir",
        out,
        "--data",
        world,
        *TINY,
        "--max-steps",
        6,
        "--save-every",
        3,
        "--eval-split",
        "none",
        "--report-to",
        "tensorboard",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 6 and summary["trainable_parameters"] == 4256 and summary["ranks_identical"]
    files = {p.name for p in out.iterdir()}
    assert {
        "adapter_config.json",
        "adapter_model.safetensors",
        "config.json",
        "README.md",
        "tokenizer.json",
        "training_config.json",
        "train_summary.json",
        "checkpoints",
        "logs",
    } <= files
    assert "backbones" not in files  # the preset's name rebuilds its seeded random backbones
    assert not (out / "model.safetensors").exists()
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-0000003", "step-0000006"]
    checkpoint = load_file(out / "checkpoints" / "step-0000006" / "model.safetensors")
    assert sum(t.numel() for t in checkpoint.values()) == 4256  # only trainable weights in checkpoints
    assert list((out / "logs").rglob("events.out.tfevents.*"))  # TensorBoard through Accelerate's tracker
    loaded = ITuningForCaptioning.from_pretrained(out)
    assert list(loaded.ituning) == ["1", "2"]
    captioned = itune(
        "caption", str(world.parent / "images" / "000000.png"), "--model", out, "--num-beams", 1, "--max-new-tokens", 4
    )
    assert captioned.returncode == 0 and captioned.stdout.count("\t") == 1


def test_a_traced_training_run_has_no_graph_break_and_saves_a_plain_adapter(world, tmp_path):
    """Under `accelerate launch --dynamo_backend X` (its ACCELERATE_DYNAMO_BACKEND; here aot_eager: traced, without
    inductor's code generation) the step traces without a graph break (tests/models/test_packing.py: with the eager
    step's loss and gradients), and the adapter is saved under the names an eager run gives it."""
    common = ["--data", world, *TINY, "--max-steps", 3, "--eval-split", "none"]
    backend = {"ACCELERATE_DYNAMO_BACKEND": "AOT_EAGER", "TORCH_LOGS": "graph_breaks"}
    traced = itune("train", "--output-dir", tmp_path / "traced", *common, env=backend)
    assert traced.returncode == 0, traced.stderr[-3000:]
    assert "Graph break" not in traced.stderr
    assert json.loads(traced.stdout.strip().splitlines()[-1])["steps"] == 3
    names = set(adapter_weights(tmp_path / "traced"))
    assert names and not any("_orig_mod" in name for name in names)
    model = ITuningForCaptioning.from_pretrained(tmp_path / "traced")  # loads as any run's adapter
    assert {name for name, _ in model.named_parameters() if "ituning" in name}


def test_torch_compile_option_compiles_with_dynamic_shapes_and_a_later_run_in_the_process_does_not(tmp_path):
    from itune_hf.training.accelerator import make_accelerator

    def plugin(**settings):
        config = TrainingConfig(preset="itune-tiny-random", data="synthetic", output_dir=str(tmp_path), **settings)
        return make_accelerator(config)[0].state.dynamo_plugin

    compiled = plugin(torch_compile=True)
    assert compiled.backend.value == "INDUCTOR" and compiled.dynamic is True
    assert plugin().backend.value == "NO"  # Accelerate would keep the earlier run's choice process-wide


def test_killed_run_resumes_bit_for_bit(world, tmp_path):
    common = ["--data", world, *TINY, "--max-steps", 8, "--save-every", 2, "--eval-split", "none"]
    assert itune("train", "--output-dir", tmp_path / "straight", *common).returncode == 0

    cut = tmp_path / "cut"
    command = [str(BIN / "itune"), "train", "--output-dir", str(cut), *map(str, common)]
    kill_once_checkpointed(command, cut / "checkpoints" / "step-0000004")
    assert not (cut / "checkpoints" / "step-0000008").exists()

    refused = itune("train", "--output-dir", cut, *common)
    assert refused.returncode == 2 and "Pass --resume to continue it" in refused.stderr
    changed = itune("train", "--output-dir", cut, *common, "--resume", "--seed", 7)
    assert changed.returncode == 2 and "seed: 0 -> 7" in changed.stderr

    resumed = itune("train", "--output-dir", cut, *common, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout + resumed.stderr
    assert same_weights(adapter_weights(tmp_path / "straight"), adapter_weights(cut))


def test_time_budget_sizes_the_run_from_a_measured_step_and_resume_keeps_that_size(world, tmp_path):
    out = tmp_path / "budget"
    common = ["--data", world, *TINY, "--max-steps", 100000, "--eval-split", "none", "--save-every", 2]
    result = itune("train", "--output-dir", out, *common, "--time-budget", 3)
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert "s per step measured" in output and "runtime: mixed precision" in output
    if sys.platform.startswith("linux"):  # the CLI restarted itself once with glibc's allocator settings
        assert "freed memory kept for reuse (glibc tunables from the start)" in output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert 1 <= summary["steps"] < 100000  # sized to the budget, not the step limit
    assert summary["captions_seen"] == summary["steps"] * 4  # batch 4, one process
    assert summary["mixed_precision"] in ("no", "bf16")
    if "over the time budget" not in output:  # a run that kept to its (re-sized) length ends its schedule at 0
        lr = [h["lr"] for h in json.loads((out / "train_summary.json").read_text())["history"] if "lr" in h]
        assert lr[-1] == pytest.approx(0.0, abs=1e-9)
    # resuming a finished sized run continues to the same size: nothing more to do, same weights
    before = adapter_weights(out)
    resumed = itune("train", "--output-dir", out, *common, "--time-budget", 3, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads(resumed.stdout.strip().splitlines()[-1])["steps"] == summary["steps"]
    assert same_weights(before, adapter_weights(out))


def single_process_schedule(peak: float, warmup: int, steps: int) -> list[float]:
    """The learning rate after each of `steps` optimizer steps of the default schedule (cosine), in one process."""
    from transformers import get_scheduler

    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=peak)
    scheduler = get_scheduler("cosine", optimizer, num_warmup_steps=warmup, num_training_steps=steps)
    rates = []
    for _ in range(steps):
        optimizer.step()
        scheduler.step()
        rates.append(scheduler.get_last_lr()[0])
    return rates


def test_two_process_ddp_on_cpu_ends_with_identical_ranks(world, tmp_path):
    out = tmp_path / "ddp"
    command = [
        str(BIN / "accelerate"),
        "launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(free_port()),
        "-m",
        "itune_hf.cli",
        "train",
        "--output-dir",
        str(out),
        "--data",
        str(world),
        *map(str, TINY),
        "--max-steps",
        "4",
        "--save-every",
        "4",
        "--eval-split",
        "none",
        "--warmup-steps",
        "2",
        "--log-every",
        "1",
    ]
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=300, env={**os.environ, "ACCELERATE_USE_CPU": "true"}
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "still referenced after training" not in result.stderr  # the DDP wrapper is freed before teardown
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["processes"] == 2 and summary["ranks_identical"] is True
    assert len(summary["rank_adapter_checksums"]) == 2
    # the schedule moves once per optimizer step, as in one process (Accelerate's default moves it once per process)
    assert [h["lr"] for h in summary["history"] if "loss" in h] == pytest.approx(single_process_schedule(1e-2, 2, 4))
    assert {p.name for p in (out / "checkpoints" / "step-0000004").iterdir()} >= {
        "random_states_0.pkl",
        "random_states_1.pkl",
    }
    assert list(ITuningForCaptioning.from_pretrained(out).ituning) == ["1", "2"]


def test_feature_cache_resumes_refuses_mismatches_and_trains_identically(world, tmp_path):
    rows = load_captions(str(world))["train"]
    vision = build_model("itune-tiny-random", pretrained=True).vision_model
    processor = build_processor("itune-tiny-random")
    cache_dir = tmp_path / "cache"
    first = cache_features(
        rows.select(range(10)),
        cache_dir,
        vision_model=vision,
        image_processor=processor.image_processor,
        dtype="float32",
        shard_size=4,
        progress=False,
    )
    assert first.cached == 10 and len(list(cache_dir.glob("shard-*.safetensors"))) == 3
    (cache_dir / "shard-00009.partial").write_bytes(b"half-written shard of an interrupted run")
    second = cache_features(
        rows,
        cache_dir,
        vision_model=vision,
        image_processor=processor.image_processor,
        dtype="float32",
        shard_size=4,
        progress=False,
    )
    assert (second.already_cached, second.cached) == (10, len(rows) - 10)
    assert not list(cache_dir.glob("*.partial"))
    cache = FeatureCache(cache_dir)
    with torch.no_grad():
        expected = vision(pixel_values=processor(images=[rows[5]["image_path"]])["pixel_values"]).last_hidden_state
    torch.testing.assert_close(cache.get([rows[5]["image_id"]]), expected)

    other = build_processor("itune-tiny-random").image_processor
    other.image_mean = [0.5, 0.5, 0.5]
    with pytest.raises(FeatureCacheMismatch, match="image_processor_sha256"):
        cache_features(rows, cache_dir, vision_model=vision, image_processor=other, dtype="float32", progress=False)

    common = ["--data", world, *TINY, "--max-steps", 3, "--save-every", 3, "--eval-split", "none", "--log-every", 1]
    common += ["--mixed-precision", "no"]  # fp32 on every CPU: under bf16 autocast the vision tower would run in bf16
    assert itune("train", "--output-dir", tmp_path / "pixels", *common).returncode == 0
    cached = itune("train", "--output-dir", tmp_path / "cached", *common, "--feature-cache", cache_dir)
    assert cached.returncode == 0, cached.stderr[-2000:]
    pixels, features = adapter_weights(tmp_path / "pixels"), adapter_weights(tmp_path / "cached")
    assert pixels.keys() == features.keys()
    for name in pixels:  # the same training; vision states batched differently differ by float rounding only
        torch.testing.assert_close(pixels[name], features[name], rtol=1e-3, atol=1e-3)
    losses = [
        [h["loss"] for h in json.loads((tmp_path / run / "train_summary.json").read_text())["history"] if "loss" in h]
        for run in ("pixels", "cached")
    ]
    assert len(losses[0]) == 3 and losses[0] == pytest.approx(losses[1], abs=1e-4)


def test_cache_features_command_and_a_mismatched_cache_is_refused_by_train(world, tmp_path):
    result = itune(
        "cache-features",
        "--preset",
        "itune-tiny-random",
        "--data",
        world,
        "--output-dir",
        tmp_path / "c",
        "--dtype",
        "float16",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "cached 40 images" in result.stdout
    fingerprint = json.loads((tmp_path / "c" / "fingerprint.json").read_text())
    fingerprint["vision_weights_sha256"] = "0" * 64  # as if made by another vision tower
    (tmp_path / "c" / "fingerprint.json").write_text(json.dumps(fingerprint))
    refused = itune(
        "train",
        "--output-dir",
        tmp_path / "r",
        "--data",
        world,
        *TINY,
        "--max-steps",
        1,
        "--eval-split",
        "none",
        "--feature-cache",
        tmp_path / "c",
    )
    assert refused.returncode == 2
    assert "vision_weights_sha256: cache has '0000" in refused.stderr and "Delete it" in refused.stderr


def test_fine_tuning_starts_from_a_given_adapter(world, tmp_path):
    common = ["--data", world, *TINY, "--eval-split", "none", "--save-every", 100]
    assert itune("train", "--output-dir", tmp_path / "vlp", *common, "--max-steps", 3).returncode == 0
    start = adapter_weights(tmp_path / "vlp")
    result = itune(
        "train",
        "--output-dir",
        tmp_path / "ft",
        *common,
        "--max-steps",
        1,
        "--learning-rate",
        "0",
        "--init-adapter",
        tmp_path / "vlp",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert same_weights(start, adapter_weights(tmp_path / "ft"))  # lr 0: the loaded weights are what is saved


def test_bad_settings_are_refused_naming_them(world, tmp_path):
    fp16 = itune("train", "--output-dir", tmp_path / "x", "--data", world, *TINY, "--mixed-precision", "fp16")
    if not torch.cuda.is_available():
        assert fp16.returncode == 2 and "fp16' needs a CUDA GPU" in fp16.stderr
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("learning_rate: 1e-3\nlearnig_rate: 2\n")
    typo = itune("train", "--config", recipe, "--output-dir", tmp_path / "y")
    assert typo.returncode == 2 and "unknown option(s) learnig_rate" in typo.stderr


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--vision-model", "V", "--text-model", "T"], "--text-model T with --preset itune-demo: a preset builds its"),
        (["--preset", "xgpt-tiny-random", "--vision-model", "V", "--text-model", "T"], "pass --preset none with"),
        (["--preset", "none", "--vision-model", "V", "--text-model", "T", "--no-pretrained"], "--no-pretrained builds"),
        (["--ida-mask-ratio", "0.4"], "--ida-mask-ratio: options of the IDA pre-training task, which --tasks ic does"),
        (["--tasks", "ic,ida", "--imlm-fraction", "0.3"], "--imlm-fraction: options of the IMLM pre-training task"),
    ],
)
def test_an_option_the_run_would_not_use_is_refused_in_one_line(tmp_path, capsys, options, message):
    from itune_hf.cli import main

    status = main(["train", "--output-dir", str(tmp_path / "o"), "--data", str(tmp_path / "no.json"), *options])
    error = capsys.readouterr().err
    assert status == 2 and message in error and len(error.strip().splitlines()) == 1, error


@pytest.mark.parametrize(
    "preset", ["itune-tiny-random", "xgpt-tiny-random", "clipcap-mlp-tiny-random", "crossattn-tiny-random"]
)
def test_gradient_checkpointing_option_reaches_every_family_without_a_deprecation_warning(preset, recwarn):
    from itune_hf.training.model import build_training_model

    for checkpointing in (False, True):
        config = TrainingConfig(output_dir="x", preset=preset, gradient_checkpointing=checkpointing)
        model = build_training_model(config).model
        assert any(getattr(module, "gradient_checkpointing", False) for module in model.modules()) is checkpointing
    deprecations = [w for w in recwarn if issubclass(w.category, FutureWarning) and "checkpointing" in str(w.message)]
    assert not deprecations, deprecations[0].message


@pytest.mark.parametrize("recipe", sorted((REPO / "examples" / "recipes").glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_recipes_are_valid_training_configs(recipe):
    values = yaml.safe_load(recipe.read_text())
    config = TrainingConfig(**values)
    assert config.output_dir.startswith("outputs/")
    global_batch = config.batch_size * config.gradient_accumulation_steps
    if config.pretraining:  # XGPT pre-training stages: batch 512 on eight GPUs (paper section 5.4)
        assert config.tasks != "ic" and global_batch * 8 == 512 and config.lr_schedule == "inverse_sqrt"
    elif recipe.stem.startswith("xgpt"):  # XGPT: 30 epochs of fine-tuning on four GPUs, batch 512
        assert config.num_epochs == 30 and global_batch * 4 == 512
    elif recipe.stem != "demo":  # I-Tuning: batch 4,096 on eight GPUs
        assert config.num_epochs in (10, 30) and global_batch * 8 == 4096


@pytest.mark.parametrize("name", ["single_gpu", "multi_gpu", "fsdp", "multi_node"])
def test_shipped_accelerate_configs_load(name):
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(REPO / "examples" / "accelerate" / f"{name}.yaml"))
    assert config.mixed_precision == "bf16"
    if name == "fsdp":  # FSDP2: FSDP1 stopped on blocks mixing frozen and trainable weights (docs/scale.md)
        assert config.fsdp_config["fsdp_version"] == 2 and config.fsdp_config["fsdp_reshard_after_forward"] is True
        assert "fsdp_use_orig_params" not in config.fsdp_config  # FSDP1's; FSDP2 keeps every parameter whole


def test_example_script_runs_and_its_adapter_captions(world, tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "examples" / "train_itune.py"),
            "--data",
            str(world),
            "--preset",
            "itune-tiny-random",
            "--max-steps",
            "4",
            "--batch-size",
            "4",
            "--output-dir",
            str(tmp_path / "ex"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    model = ITuningForCaptioning.from_pretrained(tmp_path / "ex")
    assert not (tmp_path / "ex" / "backbones").exists()  # rebuilt from the preset's name, not uploaded with it
    processor = build_processor("itune-tiny-random")
    reference = build_model("itune-tiny-random", pretrained=True)  # the same seeded random backbones
    for mine, theirs in zip(model.language_model.state_dict().items(), reference.language_model.state_dict().items()):
        assert mine[0] == theirs[0] and torch.equal(mine[1], theirs[1])
    ids = model.generate(
        **processor(images=[str(world.parent / "images" / "000001.png")]), num_beams=1, max_new_tokens=3
    )
    assert ids.shape == (1, 4)


def test_validation_keeps_the_best_adapter_and_its_card_reports_the_measured_scores(world, tmp_path):
    from itune_hf.evaluation import generate_captions, score
    from itune_hf.models.ituning.processing_ituning import ITuningProcessor

    out = tmp_path / "run"
    result = itune(
        "train", "--output-dir", out, "--data", world, *TINY, "--max-steps", 6, "--save-every", 6,
        "--eval-every", 2, "--eval-max-images", 4, "--eval-max-new-tokens", 6, "--learning-rate", 3e-2,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "train_summary.json").read_text())
    validations = [h for h in summary["history"] if "val" in h]
    assert [h["step"] for h in validations] == [2, 4, 6]
    ciders = [h["val"]["CIDEr"] for h in validations]
    best = max(range(3), key=lambda i: (ciders[i], -i))  # the first of the best
    assert summary["best_step"] == validations[best]["step"] and summary["best_val_CIDEr"] == ciders[best]

    # The saved adapter is the best one: captioning the validation images with it gives the recorded score.
    model = ITuningForCaptioning.from_pretrained(out)
    processor = ITuningProcessor.from_pretrained(out)
    rows = load_captions(str(world))["val"].select(range(4))
    captions = generate_captions(model, processor, rows, num_beams=1, max_new_tokens=6, progress=False)
    assert score(captions, rows)["CIDEr"] == pytest.approx(summary["best_val_CIDEr"], abs=1e-9)
    card = (out / "README.md").read_text()
    # a local dataset is no Hub id: the measured score is in the card's results table, not in its model-index
    assert f"| {round(100 * summary['best_val_CIDEr'], 2)} |" in card and "greedy decoding, step" in card
    assert "model-index" not in card
    # a generated world records its scenes: the scene metric is validated and on the card beside CIDEr
    object_f1 = validations[best]["val"]["Object_F1"]
    assert "Object F1" in card and f"{round(100 * object_f1, 2)} |" in card


def test_an_unreadable_training_image_is_skipped_and_too_many_refuse_the_run(world, tmp_path, capsys):
    """An undecodable training image does not stop `itune train`: it is reported and skipped, its
    pairs replaced by the next readable ones (a pure function of the index: resume stays bit-exact); training
    refuses to start when more than --max-unreadable of the data is unusable."""
    import shutil

    from itune_hf.cli import main
    from itune_hf.training import CaptionPairs

    copy = tmp_path / "data"
    shutil.copytree(world.parent, copy)
    rows = load_captions(copy / "dataset.json", split="train")
    bad = Path(rows[1]["image_path"])
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(40))  # garbage after a PNG signature
    pairs = CaptionPairs(rows, max_images=4)
    pairs.read_images(build_processor("itune-tiny-random"), max_unreadable=0.5)
    items = [pairs[i] for i in range(len(pairs))]
    assert str(bad) not in [item["image_path"] for item in items] and all(item["image"] for item in items)
    assert [item["caption"] for item in items] == [pairs[i]["caption"] for i in range(len(pairs))]  # deterministic
    assert capsys.readouterr().err.count(f"skipping unreadable image {bad}") == 1

    args = ["train", "--output-dir", tmp_path / "run", "--data", copy / "dataset.json", *TINY, "--eval-split", "none"]
    assert main([str(a) for a in [*args, "--max-steps", 2, "--save-every", 2]]) == 0
    assert f"skipping unreadable image {bad}" in capsys.readouterr().err
    assert (tmp_path / "run" / "adapter_model.safetensors").exists()
    refused = [*args, "--verify-images", "--max-unreadable", 0.01, "--output-dir", tmp_path / "refused"]
    assert main([str(a) for a in refused]) == 2
    err = capsys.readouterr().err
    assert "1 of the 40 images" in err and "more than --max-unreadable 0.01" in err and str(bad) in err
    strict = CaptionPairs(rows, max_images=4)
    strict.read_images(build_processor("itune-tiny-random"), max_unreadable=0.0)
    with pytest.raises(ValueError, match=r"stopped after 1 unreadable training images of 4 \(the others not all"):
        [strict[i] for i in range(len(strict))]


def test_train_runs_in_a_process_where_an_earlier_run_chose_another_precision(world, tmp_path, capsys):
    """A notebook runs a `Trainer` (Accelerate's state: fp32), then `itune train` in bf16: Accelerate keeps the first
    choice process-wide and would refuse the second ("restart your runtime"); `itune train` starts afresh."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from itune_hf.cli import main

    AcceleratorState._reset_state(reset_partial_state=True)  # whatever earlier tests in this process left
    Accelerator(mixed_precision="no")  # what the earlier run leaves behind
    try:
        args = ["train", "--output-dir", tmp_path / "run", "--data", world, *TINY, "--eval-split", "none"]
        args += ["--max-steps", 1, "--mixed-precision", "bf16"]
        assert main([str(a) for a in args]) == 0, capsys.readouterr().err
        assert AcceleratorState().mixed_precision == "bf16"
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)


def test_rank_checksums_stay_on_the_weights_device():
    """`itune train` on a GPU crashed after its last step (2026-11-26, H200): the checksums multiplied CUDA weights
    by positions made on the CPU. The meta device stands in for CUDA here: any device but the CPU's failed."""
    from types import SimpleNamespace

    from itune_hf.training.accelerator import _rank_checksums

    model = torch.nn.Linear(3, 2, device="meta")
    accelerator = SimpleNamespace(unwrap_model=lambda m: m, gather=lambda t: t, device=torch.device("meta"))
    checksums = _rank_checksums(accelerator, model)
    assert checksums.shape == (1, 3) and checksums.device.type == "meta"

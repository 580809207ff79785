"""Errors at the boundary: each bad input below is made by the test, given to the CLI as a user gives it, and must end
in exit status 2 with one line on stderr naming the input (file, flag or recipe key) and no traceback; `ITUNE_DEBUG=1`
shows the traceback, and a bug (an unexpected exception) always does. The table of these probes is RELIABILITY.md's
"Errors at the boundary"."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from itune_hf import errors
from itune_hf.cli import main
from itune_hf.utils import output_dirs

pytestmark = pytest.mark.slow  # learning runs, subprocesses, kills or benchmarks: only make test-slow runs them

SYNTHETIC = ["--num-images", "8", "--image-size", "32"]
TRAIN = ["--preset", "itune-tiny-random", "--batch-size", "4", "--report-to", "none", "--mixed-precision", "no"]
TRAIN += ["--eval-split", "none"]


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """In-process `train`/`eval` runs set accelerate's process-wide state: start and leave each test without it."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def fails(argv: list[str], capsys, *named: str) -> str:
    """Run `itune argv` in-process; assert exit status 2 and a last stderr line naming each of `named`, without a
    traceback; return that line."""
    try:
        status = main([str(a) for a in argv])
    except SystemExit as exit_:  # argparse refuses a flag's value
        status = exit_.code
    err = capsys.readouterr().err
    assert status == 2, err
    assert "Traceback" not in err, err
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"itune {argv[0]}: error: "), err
    for name in named:
        assert str(name) in line, line
    return line


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("probe-data")
    assert main(["make-synthetic", "--output-dir", str(root), *SYNTHETIC]) == 0
    return root / "dataset.json"


@pytest.fixture
def image(data) -> Path:
    return next((data.parent / "images").iterdir())


def damaged_copy(source: Path, tmp_path: Path, name: str) -> Path:
    target = tmp_path / name
    shutil.copytree(source, target)
    return target


# ---------------------------------------------------------------------------------------------------- model files
def test_damaged_or_incomplete_model_directories_name_the_file(captioner_dirs, image, tmp_path, capsys):
    adapter = damaged_copy(captioner_dirs["adapter"], tmp_path, "truncated")
    weights = adapter / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    fails(["caption", image, "--model", adapter], capsys, "--model", weights, "damaged or truncated")

    full = damaged_copy(captioner_dirs["full"], tmp_path, "garbage")
    (full / "model.safetensors").write_bytes(b"garbage" * 10)
    fails(["caption", image, "--model", full], capsys, full / "model.safetensors")

    truncated = damaged_copy(captioner_dirs["full"], tmp_path, "half")
    whole = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(whole[: len(whole) // 2])
    fails(["caption", image, "--model", truncated], capsys, truncated / "model.safetensors")

    no_processor = damaged_copy(captioner_dirs["full"], tmp_path, "no-processor")
    for name in ("processor_config.json", "preprocessor_config.json"):
        (no_processor / name).unlink(missing_ok=True)
    fails(["caption", image, "--model", no_processor], capsys, no_processor, "no processor files")

    no_weights = damaged_copy(captioner_dirs["full"], tmp_path, "no-weights")
    (no_weights / "model.safetensors").unlink()
    fails(["caption", image, "--model", no_weights], capsys, no_weights, "no model weights")

    nested = damaged_copy(captioner_dirs["full"], tmp_path, "nested")
    (nested / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    fails(["caption", image, "--model", nested], capsys, nested / "config.json", "nested too deeply")


def test_a_pickle_checkpoint_is_refused_in_one_line(captioner_dirs, image, tmp_path, capsys):
    import torch

    class Planted:
        def __reduce__(self):
            return (print, ("planted code ran",))

    full = damaged_copy(captioner_dirs["full"], tmp_path, "pickle")
    (full / "model.safetensors").unlink()
    torch.save({"weight": Planted()}, full / "pytorch_model.bin")
    line = fails(["caption", image, "--model", full], capsys, "--model", full)
    assert "planted code ran" not in capsys.readouterr().out + line


@pytest.mark.parametrize(
    ("model", "says"),
    [
        ("/does/not/exist", "no such directory"),
        ("itune-tiny-random", "a preset"),
        ("nobody/no-such-captioner", "Hugging Face Hub"),  # offline in tests: the Hub cannot provide it
    ],
)
def test_a_model_argument_that_names_nothing_says_what_was_tried(model, says, image, capsys):
    fails(["caption", image, "--model", model], capsys, f"--model {model}", says)
    fails(["eval", "--model", model, "--data", "synthetic"], capsys, f"--model {model}")


# --------------------------------------------------------------------------------------------- flags and recipes
@pytest.mark.parametrize(
    "argv",
    [
        ["cache-features", "--preset", "itune-tiny-random", "--output-dir", "c", "--shard-size", "0"],
        ["cache-features", "--preset", "itune-tiny-random", "--output-dir", "c", "--batch-size", "-2"],
        ["train", "--output-dir", "o", "--max-steps", "0"],
        ["train", "--output-dir", "o", "--max-steps", "-3"],
        ["train", "--output-dir", "o", "--keep-checkpoints", "0"],
        ["train", "--output-dir", "o", "--learning-rate", "nan"],
        ["train", "--output-dir", "o", "--learning-rate", "-1e-4"],
        ["eval", "--model", "m", "--num-beams", "0"],
        ["caption", "x.png", "--model", "m", "--max-new-tokens", "0"],
        ["make-synthetic", "--output-dir", "s", "--image-size", "30000"],
        ["make-synthetic", "--output-dir", "s", "--num-images", "0"],
        # inf would train to NaN weights and exit 0 (as NaN would); 1000 workers would swamp the machine's cores
        ["train", "--output-dir", "o", "--learning-rate", "inf"],
        ["train", "--output-dir", "o", "--weight-decay", "inf"],
        ["train", "--output-dir", "o", "--scale", "inf"],
        ["train", "--output-dir", "o", "--num-workers", "1000"],
        ["pretrain-vision", "--output-dir", "o", "--learning-rate", "inf"],
        ["average-checkpoints", "run", "--output-dir", "o", "--top", "0"],
        ["make-shards", "--output-dir", "o", "--caption-index", "-100"],
        ["demo", "--num-images", "1"],  # checked when parsed, not a KeyError of a missing split later
    ],
)
def test_numeric_options_are_checked_when_parsed(argv, capsys):
    flag = next(a for a in reversed(argv) if a.startswith("--"))
    fails(argv, capsys, f"argument {flag}", "expected")


def test_recipe_values_are_typed_once_naming_key_value_and_type(data, tmp_path, capsys):
    from itune_hf.cli import build_parser
    from itune_hf.commands.train import config_from_args

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("learning_rate: 1e-4\nmax_steps: '3'\nuse_aoa_refiner: 'no'\neval_max_images: none\n")
    args = build_parser().parse_args(["train", "--config", str(recipe), "--output-dir", str(tmp_path / "o")])
    config = config_from_args(args)  # YAML reads 1e-4 as a string: coerced by the option's type
    assert (config.learning_rate, config.max_steps, config.use_aoa_refiner) == (1e-4, 3, False)
    assert config.eval_max_images is None
    flags = ["train", "--output-dir", "o", "--eval-split", "none", "--eval-max-images", "none", "--max-steps", "2"]
    config = config_from_args(build_parser().parse_args(flags))
    assert (config.eval_split, config.eval_max_images, config.max_steps) == (None, None, 2)

    for text, named in [
        ('learning_rate: "1e-3x"\n', ["learning_rate", "'1e-3x'", "a number >= 0"]),
        ("batch_size: [4]\n", ["batch_size", "[4]", "an integer >= 1"]),
        ("keep_checkpoints: 0\n", ["keep_checkpoints", "an integer >= 1"]),
        ("pretrained: maybe\n", ["pretrained", "true or false"]),
        ("data: 3\n", ["data", "a string"]),
        ("learning-rate: 0.1\n", ["unknown option(s) learning-rate (did you mean learning_rate?)"]),
        ("[1, 2]\n", ["expected a mapping"]),
        ("a: [\n", ["not valid YAML"]),
    ]:
        recipe.write_text(text)
        fails(["train", "--config", recipe, "--output-dir", tmp_path / "o"], capsys, f"--config {recipe}", *named)


# ------------------------------------------------------------------------------------------- data files and paths
def test_bad_json_shapes_name_the_file_and_field(data, tmp_path, capsys):
    predictions, references = tmp_path / "predictions.json", tmp_path / "references.json"
    predictions.write_text(json.dumps([{"image_id": 1, "caption": "a red square"}]))
    references.write_text(json.dumps({"annotations": [{"image_id": [1], "caption": "a red square"}]}))
    fails(["score", predictions, references], capsys, references, '"image_id"')
    references.write_text(json.dumps({"annotations": [{"image_id": 1, "caption": 7}]}))
    fails(["score", predictions, references], capsys, references, '"caption"')
    references.write_text("[" * 100_000 + "]" * 100_000)
    fails(["score", predictions, references], capsys, references, "nested too deeply")

    dataset = json.loads(data.read_text())
    dataset["images"][0]["cocoid"] = [1]  # an image id that is a list
    bad = data.parent / "bad-ids.json"
    bad.write_text(json.dumps(dataset))
    fails(["cache-features", "--data", bad, "--preset", "itune-tiny-random", "--output-dir", tmp_path / "c"],
          capsys, bad, "images[0]", "'cocoid'")  # fmt: skip


def test_paths_that_cannot_be_written_are_refused_before_work(data, captioner_dirs, tmp_path, capsys, monkeypatch):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    predictions, references = tmp_path / "p.json", tmp_path / "r.json"
    predictions.write_text(json.dumps([{"image_id": 1, "caption": "a"}]))
    references.write_text(json.dumps({"annotations": [{"image_id": 1, "caption": "a"}]}))
    fails(["score", predictions, references, "--per-image", tmp_path], capsys, f"--per-image {tmp_path}", "directory")
    fails(["make-synthetic", "--output-dir", a_file / "sub", *SYNTHETIC], capsys, f"--output-dir {a_file / 'sub'}")
    fails(["train", "--data", data, "--output-dir", a_file, *TRAIN], capsys, f"--output-dir {a_file}")
    model = captioner_dirs["full"]
    fails(["eval", "--model", model, "--data", data, "--output-dir", a_file], capsys, f"--output-dir {a_file}")
    fails(["eval", "--model", model, "--data", data, "--metrics", "BLEU,CIDEx"], capsys, "--metrics", "'CIDEx'")
    assert not (model / "eval-test").exists()  # refused before captioning

    def unwritable(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(args[0]))

    monkeypatch.setattr(output_dirs, "open", unwritable, raising=False)  # root writes anywhere: fake a read-only dir
    out = tmp_path / "locked" / "out"
    cache_argv = ["cache-features", "--data", data, "--preset", "itune-tiny-random", "--output-dir", out]
    fails(cache_argv, capsys, f"--output-dir {out}", "permission denied")


# ------------------------------------------------------------------------------------------------------- training
@pytest.fixture(scope="module")
def trained(data, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("probe-run") / "run"
    argv = ["train", "--data", str(data), "--output-dir", str(run), *TRAIN, "--max-steps", "1"]
    assert main(argv) == 0
    return run


def test_damaged_and_pickle_training_checkpoints_are_refused_by_name(data, trained, tmp_path, capsys):
    import torch

    from itune_hf.training.checkpoints import write_manifest

    for name, damage in [
        ("damaged", lambda path: path.write_bytes(path.read_bytes()[:300])),
        ("pickle", lambda path: torch.save({"state": print}, path)),  # a global: refused by weights_only
    ]:
        run = damaged_copy(trained, tmp_path, name)
        (checkpoint,) = (run / "checkpoints").iterdir()
        damage(checkpoint / "optimizer.bin")
        argv = ["train", "--data", data, "--output-dir", run, *TRAIN, "--max-steps", "1", "--resume"]
        # the manifest written at save time finds the change before anything is read
        fails(argv, capsys, checkpoint.name, "optimizer.bin", "is sound")
        write_manifest(checkpoint)  # a checkpoint whose manifest agrees (written so by a foreign tool): read, refused
        fails(argv, capsys, checkpoint, "cannot read the checkpoint")


def test_a_feature_cache_of_other_images_is_refused_not_a_hang(data, tmp_path, capsys):
    cache = tmp_path / "cache"
    other = tmp_path / "other"
    assert main(["make-synthetic", "--output-dir", str(other), *SYNTHETIC]) == 0
    dataset = json.loads((other / "dataset.json").read_text())
    for index, entry in enumerate(dataset["images"]):
        entry["cocoid"] = 1000 + index  # ids none of the cache's images have
    (other / "dataset.json").write_text(json.dumps(dataset))
    cache_argv = ["cache-features", "--data", str(data), "--preset", "itune-tiny-random", "--output-dir", str(cache)]
    assert main(cache_argv) == 0
    capsys.readouterr()
    argv = ["train", "--data", other / "dataset.json", "--feature-cache", cache, "--output-dir", tmp_path / "o", *TRAIN]
    fails(argv, capsys, f"--feature-cache {cache}", "none of the")


def test_data_without_a_val_split_trains_and_names_eval_split_none(data, tmp_path, capsys):
    dataset = json.loads(data.read_text())
    dataset["images"] = [entry for entry in dataset["images"] if entry["split"] != "val"]
    for entry in dataset["images"]:
        entry["filepath"] = str(data.parent / entry["filepath"])
    no_val = tmp_path / "no-val.json"
    no_val.write_text(json.dumps(dataset))
    argv = ["train", "--data", str(no_val), "--output-dir", str(tmp_path / "o"), *TRAIN[:-2], "--max-steps", "1"]
    argv += ["--image-root", str(data.parent)]  # the images lie under the data's folder, not under no-val.json's
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "has no 'val' split" in err and "--eval-split none" in err
    assert (tmp_path / "o" / "adapter_model.safetensors").is_file()


def test_images_outside_the_image_root_are_refused_by_every_command_unless_allowed(data, tmp_path, capsys):
    """A data file whose entry leads out of its image root (`..`) is refused in one line naming the entry and the
    flag, by training and evaluation alike; `--allow-outside-image-root` reads it."""
    root = tmp_path / "root"
    shutil.copytree(data.parent, root)
    dataset = json.loads((root / "dataset.json").read_text())
    entry = next(e for e in dataset["images"] if e["split"] == "train")
    shutil.copy(root / entry["filepath"] / entry["filename"], tmp_path / "outside.png")
    entry.update(filepath="..", filename="outside.png")
    (root / "dataset.json").write_text(json.dumps(dataset))
    named = ("outside.png, outside the image root", "--allow-outside-image-root")
    train = ["train", "--data", root / "dataset.json", "--output-dir", tmp_path / "o", *TRAIN, "--max-steps", "1"]
    fails(train, capsys, *named)
    fails(["eval", "--model", "m", "--data", root / "dataset.json", "--split", "train"], capsys, *named)
    fails(
        ["make-shards", "--data", root / "dataset.json", "--split", "train", "--output-dir", tmp_path / "s"],
        capsys,
        *named,
    )
    assert main([str(a) for a in train] + ["--allow-outside-image-root"]) == 0


def test_task_weights_must_be_positive(capsys):
    argv = ["train", "--output-dir", "o", "--preset", "xgpt-tiny-random", "--tasks", "ic,imlm", "--task-weights", "1,0"]
    fails(argv, capsys, "task_weights='1,0': imlm would have weight 0, which trains nothing")  # leave it out instead


def test_a_captioner_with_non_finite_weights_is_refused_where_it_is_loaded(captioner_dirs, image, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    model = damaged_copy(captioner_dirs["full"], tmp_path, "nan-model")
    weights = load_file(model / "model.safetensors")
    name = next(name for name, tensor in weights.items() if tensor.is_floating_point())
    weights[name] = torch.full_like(weights[name], float("nan"))
    save_file(weights, str(model / "model.safetensors"), metadata={"format": "pt"})
    fails(["caption", image, "--model", model], capsys, f"--model {model}", "hold NaN or infinite values")


# ------------------------------------------------------------------------------------------ the handler itself
def test_itune_debug_shows_the_traceback_and_bugs_always_do(tmp_path, capsys, monkeypatch):
    missing = tmp_path / "missing.json"
    argv = ["score", str(missing), str(missing)]
    fails(argv, capsys, missing)
    monkeypatch.setenv("ITUNE_DEBUG", "1")
    with pytest.raises(FileNotFoundError):
        main(argv)
    monkeypatch.delenv("ITUNE_DEBUG")

    from itune_hf.commands import score

    def bug(args):
        raise TypeError("a bug in itune")

    monkeypatch.setattr(score, "run", bug)
    with pytest.raises(TypeError, match="a bug in itune"):
        main(argv)

    def lookup_bug(args):  # a KeyError is a bug: raised, never one line that hides it
        return {}["test"]

    monkeypatch.setattr(score, "run", lookup_bug)
    with pytest.raises(KeyError):
        main(argv)
    assert errors.error_message(errors.UnknownNameError("Unknown preset 'x'")) == "Unknown preset 'x'"


def test_the_console_script_prints_one_line_and_exit_status_2(tmp_path):
    predictions = tmp_path / "predictions.json"
    predictions.write_text('[{"image_id": 1, "caption": ')  # truncated JSON
    result = subprocess.run(
        [sys.executable, "-m", "itune_hf.cli", "score", str(predictions), str(predictions)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"itune score: error: {predictions}: not valid JSON (line 1, column 29: Expecting value)"
    ]


@pytest.mark.parametrize("fingerprint", ["[]", "{}", '{"dtype": 3}'])
def test_a_feature_cache_fingerprint_that_is_not_one_is_named(fingerprint, data, tmp_path, capsys):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "fingerprint.json").write_text(fingerprint)  # named, not a KeyError's text
    argv = ["train", "--data", data, "--output-dir", tmp_path / "o", *TRAIN, "--feature-cache", cache]
    fails(argv, capsys, f"{cache / 'fingerprint.json'}: not a feature cache fingerprint")


def test_eval_of_images_none_readable_names_each_and_promises_no_metrics(captioner_dirs, tmp_path, capsys):
    """It said that metrics.json lists the skipped images, then wrote none."""
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)  # a PNG header, then nothing usable
    entry = {"filename": "broken.png", "split": "val", "cocoid": 1, "sentences": [{"raw": "a red square"}]}
    data = tmp_path / "data.json"
    data.write_text(json.dumps({"images": [entry]}))
    argv = ["eval", "--model", str(captioner_dirs["full"]), "--data", str(data), "--split", "val"]
    assert main([*argv, "--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "skipped " + str(tmp_path / "broken.png") in err and "could be read" in err
    assert "metrics.json lists" not in err and not (tmp_path / "out" / "metrics.json").exists()

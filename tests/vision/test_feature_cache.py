"""The feature cache (`itune_hf.vision.feature_cache`, `itune cache-features`): the README's route (cache, train,
eval), a cache of other image files refused by `train` and computed again by `cache-features`, missing or damaged
shards healed, unreadable images reported by path, the vision fingerprint, the output lock and non-finite states."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from itune_hf.cli import main
from itune_hf.data.synthetic import make_synthetic

pytestmark = [  # learning runs, subprocesses, kills or benchmarks: only make test-slow runs them
    pytest.mark.slow,
    pytest.mark.usefixtures("fresh_accelerator_state"),  # runs `itune train` in-process
]

TINY = ["--preset", "itune-tiny-random", "--batch-size", "4", "--report-to", "none", "--learning-rate", "1e-2"]
TINY += ["--eval-split", "none", "--mixed-precision", "no"]


def cache_features_cli(world: Path, cache: Path, *extra: str) -> int:
    return main(["cache-features", "--preset", "itune-tiny-random", "--data", str(world), "--output-dir", str(cache),
                 "--dtype", "float32", "--shard-size", "4", *extra])  # fmt: skip


def test_readme_route_cache_train_eval_with_the_cache(world, tmp_path):
    cache, run = tmp_path / "cache", tmp_path / "run"
    assert cache_features_cli(world, cache) == 0
    assert main(["train", "--output-dir", str(run), "--data", str(world), *TINY, "--max-steps", "2",
                 "--feature-cache", str(cache)]) == 0  # fmt: skip
    evaluate = ["eval", "--model", str(run), "--data", str(world), "--split", "test", "--feature-cache", str(cache)]
    evaluate += ["--num-beams", "1", "--max-new-tokens", "3", "--metrics", "cider"]
    evaluate += ["--output-dir", str(tmp_path / "eval")]
    assert main(evaluate) == 0
    assert (tmp_path / "eval" / "metrics.json").is_file()


def test_a_cache_of_another_dataset_is_refused_by_train_and_recomputed_by_cache_features(world, tmp_path, capsys):
    other = make_synthetic(tmp_path / "other", num_images=12, seed=1, image_size=32)  # same ids, other images
    cache = tmp_path / "cache"
    assert cache_features_cli(other, cache) == 0
    common = ["train", "--output-dir", str(tmp_path / "run"), "--data", str(world), *TINY, "--max-steps", "1"]
    capsys.readouterr()
    assert main([*common, "--feature-cache", str(cache)]) == 2
    err = capsys.readouterr().err
    assert "holds states of other image files" in err and str(world.parent / "images") in err

    assert cache_features_cli(world, cache) == 0  # the entries are computed again from this dataset's files
    assert "computed from other image files and were computed again" in capsys.readouterr().out
    assert main([*common, "--feature-cache", str(cache)]) == 0


def test_a_missing_or_damaged_shard_heals_and_bad_images_are_reported_by_path(world, tmp_path, capsys):
    from itune_hf.vision.feature_cache import FeatureCache

    data = tmp_path / "data"
    shutil.copytree(world.parent, data)
    cache = tmp_path / "cache"
    assert cache_features_cli(data / "dataset.json", cache) == 0  # 12 images: shards 0, 1, 2
    (cache / "shard-00001.safetensors").unlink()  # a lost middle shard
    (cache / "shard-00002.safetensors").write_bytes(b"\x00" * 20)  # a truncated one
    entries = json.loads((data / "dataset.json").read_text())["images"]
    broken = data / entries[0]["filepath"] / entries[0]["filename"]
    cached_ids = FeatureCache(cache).image_ids()
    broken.write_bytes(b"not a png")  # its cached entry no longer matches; it is computed again and fails
    capsys.readouterr()
    assert cache_features_cli(data / "dataset.json", cache) == 1
    out, err = capsys.readouterr()
    assert "shard-00002.safetensors is damaged" in err and str(broken) in err and "1 image(s) could not be read" in err
    healed = FeatureCache(cache)
    assert not healed.damaged and len(healed) == 12 and set(cached_ids) <= set(healed.image_ids())
    failed = json.loads((cache / "failed.json").read_text())
    assert [entry["path"] for entry in failed.values()] == [str(broken)]


def test_the_fingerprint_ignores_how_a_processor_was_saved_but_not_what_changes_pixels():
    from itune_hf.presets import build_model, build_processor
    from itune_hf.vision.feature_cache import vision_fingerprint

    vision = build_model("itune-tiny-random", pretrained=True).vision_model
    processor = build_processor("itune-tiny-random").image_processor
    before = vision_fingerprint(vision, processor, "float32")
    processor.auto_map = {"AutoImageProcessor": "processing_ituning.X"}  # what a save_pretrained round trip adds
    processor._processor_class = "ITuningProcessor"
    assert vision_fingerprint(vision, processor, "float32") == before
    processor.image_mean = [0.5, 0.5, 0.5]
    changed = vision_fingerprint(vision, processor, "float32")
    assert changed["image_processor_sha256"] != before["image_processor_sha256"]


def test_cache_features_takes_the_lock_refuses_a_foreign_directory_and_non_finite_states(world, tmp_path, capsys):
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from itune_hf.errors import InputError
    from itune_hf.vision.feature_cache import FeatureCache

    from conftest import held_by_a_live_process

    cache = tmp_path / "cache"
    with held_by_a_live_process(cache, "itune cache-features") as pid:
        assert cache_features_cli(world, cache) == 2  # never two writers overwriting same-named shards
    assert f"in use by itune cache-features (pid {pid}" in capsys.readouterr().err
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    assert cache_features_cli(world, tmp_path / "mine") == 2
    assert "holds files itune cache-features did not write (notes.txt)" in capsys.readouterr().err
    assert cache_features_cli(world, cache) == 0
    shard = cache / "shard-00000.safetensors"
    metadata = safe_open(str(shard), "pt").metadata()
    states = load_file(shard)["states"]
    states[0, 0, 0] = float("nan")
    save_file({"states": states}, str(shard), metadata=metadata)
    loaded = FeatureCache(cache)
    with pytest.raises(InputError, match="hold NaN or infinite values"):
        loaded.get(loaded.image_ids()[:2])


def test_training_refuses_a_cache_of_fewer_images_than_the_data(world, tmp_path, capsys):
    """A cache built from part of the training images: training left the rest out, saying they had been unreadable."""
    data = tmp_path / "data"
    shutil.copytree(world.parent, data)
    entries = json.loads((data / "dataset.json").read_text())
    train = [entry for entry in entries["images"] if entry["split"] == "train"]
    half = {**entries, "images": [entry for entry in entries["images"] if entry not in train[1::2]]}
    (data / "half.json").write_text(json.dumps(half))
    cache = tmp_path / "cache"
    assert cache_features_cli(data / "half.json", cache) == 0
    capsys.readouterr()
    argv = ["train", "--output-dir", str(tmp_path / "run"), "--data", str(data / "dataset.json"), *TINY]
    assert main([*argv, "--max-steps", "1", "--feature-cache", str(cache)]) == 2
    err = capsys.readouterr().err
    assert f"lacks {len(train[1::2])} training images of" in err and "that it does not list as unreadable" in err, err
    assert f"itune cache-features --data {data / 'dataset.json'} --output-dir {cache}" in err

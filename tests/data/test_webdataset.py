"""WebDataset shards streamed through `datasets` (split over processes and workers, bad shards skipped, training on
them, resuming), and Visual Genome without the COCO Karpathy val/test images."""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from itune_hf.cli import main
from itune_hf.data import BadShardWarning, CocoOverlapWarning, DataError, DataFormatError, load_captions
from itune_hf.data.webdataset import expand_braces, read_shard
from itune_hf.training import CaptionStream, StreamCollator, StreamLoader
from itune_hf.training.data import CollateFullBatches, EpochLength

TINY = ["--preset", "itune-tiny-random", "--batch-size", "4", "--report-to", "none", "--learning-rate", "1e-2"]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """20 samples of a synthetic world in 4 shards of 5, written by `itune make-shards`."""
    root = tmp_path_factory.mktemp("shards")
    assert (
        main(["make-synthetic", "--output-dir", str(root / "world"), "--num-images", "24", "--image-size", "32"]) == 0
    )
    argv = ["make-shards", "--data", str(root / "world"), "--output-dir", str(root / "shards"), "--shard-size", "5"]
    assert main(argv) == 0
    return root / "shards"


def ids_read_by(rows, rank: int, processes: int, workers: int, epoch: int = 0) -> list[str]:
    stream = CaptionStream(rows, num_pairs=20, rank=rank, num_processes=processes, seed=3, buffer_size=4)
    stream.set_epoch(epoch)
    loader = torch.utils.data.DataLoader(stream, batch_size=3, num_workers=workers, collate_fn=list)
    return [item["image_id"] for batch in loader for item in batch]


def test_shards_stream_undecoded_and_each_pair_is_read_once_by_one_worker_of_one_rank(shards, capsys):
    capsys.readouterr()
    assert expand_braces("s/{00000..00003}.tar") == [f"s/0000{i}.tar" for i in range(4)]
    for data in (f"{shards}/{{00000..00003}}.tar", f"{shards}/*.tar", str(shards)):
        stream = load_captions(data, split="train")
        assert stream.n_shards == 4 and stream.info.splits["train"].num_examples == 20
    first = next(iter(stream))
    assert isinstance(first["image"], bytes) and first["image"].startswith(b"\x89PNG")  # read, not decoded
    assert first["captions"][0].endswith(".") and first["shard"] == str(shards / "00000.tar")

    ranks = [ids_read_by(stream, rank, processes=2, workers=2) for rank in range(2)]
    assert sorted(ranks[0] + ranks[1]) == [f"{i:09d}" for i in range(20)]  # every pair once, all ranks together
    shard_of = {f"{i:09d}": i // 5 for i in range(20)}
    assert {shard_of[i] for i in ranks[0]} == {0, 2} and {shard_of[i] for i in ranks[1]} == {1, 3}
    assert ranks[0] == ids_read_by(stream, 0, processes=2, workers=2)  # a pure function of (seed, epoch)
    assert ranks[0] != ids_read_by(stream, 0, processes=2, workers=2, epoch=1)
    with pytest.raises(ValueError, match="4 shard\\(s\\) for 5 processes"):
        CaptionStream(stream, num_pairs=20, rank=0, num_processes=5)
    assert main(["make-shards", "--data", str(shards), "--output-dir", str(shards.parent / "again")]) == 2
    assert "streamed WebDataset shards are for training" in capsys.readouterr().err


@pytest.mark.parametrize("workers", [0, 2, 3])
def test_an_epoch_of_a_stream_is_as_many_batches_as_its_pairs_fill_whatever_the_workers(shards, workers):
    stream = CaptionStream(load_captions(str(shards), split="train"), num_pairs=20, seed=3, buffer_size=4)
    ids = lambda items: [item["image_id"] for item in items]  # noqa: E731
    collate = CollateFullBatches(ids, 3)
    loader = torch.utils.data.DataLoader(stream, batch_size=3, num_workers=workers, collate_fn=collate)
    epoch = list(StreamLoader(loader))  # each worker ends on a short batch: 2 workers alone would give 8 (4 + 4)
    assert len(epoch) == EpochLength.of(SimpleNamespace(batch_size=3, gradient_accumulation_steps=1), 20, 1).steps == 7
    assert [len(batch) for batch in epoch] == [3] * 6 + [2]
    assert sorted(sum(epoch, [])) == [f"{i:09d}" for i in range(20)]  # every pair once


def add(tar: tarfile.TarFile, name: str, payload: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(payload)
    tar.addfile(info, io.BytesIO(payload))


def test_bad_shards_are_reported_by_shard_and_key_and_skipped(shards, tmp_path):
    with tarfile.open(shards / "00000.tar") as source:
        image = source.extractfile("000000000.png").read()
    bad = tmp_path / "bad"
    bad.mkdir()
    with tarfile.open(bad / "00000.tar", "w") as tar:
        add(tar, "a.png", image)
        add(tar, "a.txt", b"a good caption")
        add(tar, "b.png", image)  # no caption
        add(tar, "c.jpg", b"not an image")
        add(tar, "c.json", json.dumps({"caption": "garbage bytes"}).encode())
        add(tar, "d.png", image[: len(image) // 2])  # its header reads; its pixels do not decode
        add(tar, "d.txt", b"truncated pixels")
    whole = (shards / "00001.tar").read_bytes()
    (bad / "00001.tar").write_bytes(whole[: len(whole) // 2])  # truncated shard

    with pytest.warns(BadShardWarning) as caught:
        rows = list(load_captions(f"{bad}/{{00000..00001}}.tar", split="train"))
    messages = [str(w.message) for w in caught]
    assert any(f"{bad / '00000.tar'}: key 'b': no caption" in m for m in messages)
    assert any(f"{bad / '00000.tar'}: key 'c': the .jpg member is not a readable image" in m for m in messages)
    assert any(f"{bad / '00001.tar'}: truncated or corrupt tar after key" in m for m in messages)
    assert [row["image_id"] for row in rows][:2] == ["a", "d"] and 2 < len(rows) < 7  # the readable part kept

    items = [{"image_id": r["image_id"], "image": r["image"], "shard": r["shard"], "caption": "x"} for r in rows[:2]]
    decoded = []

    class Recorder:  # the visual inputs, recording the items they are given
        source, feature_cache, vision_states_input = "grid", None, "encoder_outputs"

        def __call__(self, processor, items, captions):
            decoded.extend(items)
            return {}

    collate = StreamCollator(None, visual=Recorder())
    with pytest.warns(BadShardWarning, match=f"{bad / '00000.tar'}: key 'd': unreadable image data"):
        collate(items)
    assert [item["image_id"] for item in decoded] == ["a"] and decoded[0]["image"].size == (32, 32)
    with pytest.raises(DataError, match="key 'b': no caption"):
        list(read_shard(bad / "00000.tar", on_missing="error"))


def test_a_sample_whose_members_are_apart_is_reported_and_not_counted(shards, tmp_path):
    with tarfile.open(shards / "00000.tar") as source:
        image = source.extractfile("000000000.png").read()
    shard = tmp_path / "00000.tar"
    with tarfile.open(shard, "w") as tar:  # a and b interleaved (files added in the order a shell lists them by type)
        for name, payload in (("a.png", image), ("b.png", image), ("a.txt", b"one"), ("b.txt", b"two")):
            add(tar, name, payload)
        add(tar, "c.png", image)
        add(tar, "c.txt", b"three")
    apart = f"{shard}: key 'a': more of its members follow key 'b'"
    with pytest.warns(BadShardWarning, match=f"{apart} \\(and 1 more such runs\\): a WebDataset shard holds"):
        stream = load_captions(str(shard), split="train")  # counted from the headers: reported once, up front
    assert stream.info.splits["train"].num_examples == 1  # the count is what is read
    with pytest.warns(BadShardWarning) as caught:
        rows = list(read_shard(shard))
    assert [row["image_id"] for row in rows] == ["c"]
    assert any(f"{apart}: a WebDataset shard holds" in str(w.message) for w in caught)
    with pytest.raises(DataError, match=f"{apart} \\(and 1 more such runs\\).*tar --sort=name"):
        load_captions(str(shard), split="train", on_missing="error")


def test_itune_train_on_shards_and_resume_lands_on_the_same_pairs(shards, tmp_path, capsys):
    data = f"{shards}/{{00000..00003}}.tar"
    common = ["--data", data, *TINY, "--max-steps", "7", "--save-every", "3", "--eval-split", "none"]
    straight = tmp_path / "straight"
    assert main(["train", "--output-dir", str(straight), *common, "--num-workers", "2"]) == 0
    out = capsys.readouterr().out
    assert "20 samples in 4 WebDataset shards" in out and "on 20 captions of 20 images" in out
    summary = json.loads(out.strip().splitlines()[-1])
    # an epoch is 5 batches of 4 (each of the 2 workers' last 2 pairs joined in one), so step 7 is batch 2 of epoch 1
    assert summary["steps"] == 7 and summary["captions_seen"] == 28 and summary["epochs"] == pytest.approx(1.4)

    cut = tmp_path / "cut"  # the same run, stopped after its step-6 checkpoint (mid-epoch 1)
    shutil.copytree(straight, cut)
    shutil.rmtree(cut / "checkpoints" / "step-0000007")
    (cut / "adapter_model.safetensors").unlink()
    progress = json.loads((cut / "checkpoints" / "step-0000006" / "progress.json").read_text())
    assert (progress["epoch"], progress["batch_in_epoch"]) == (1, 1)
    assert main(["train", "--output-dir", str(cut), *common, "--num-workers", "2", "--resume"]) == 0
    assert "resumed from" in capsys.readouterr().out
    a, b = load_file(straight / "adapter_model.safetensors"), load_file(cut / "adapter_model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("flags", [["--verify-images"], ["--max-unreadable", "0.2"]])
def test_checks_that_count_a_split_before_training_are_refused_for_shards(shards, tmp_path, capsys, flags):
    data = f"{shards}/{{00000..00003}}.tar"
    argv = ["train", "--output-dir", str(tmp_path / "o"), "--data", data, *TINY, "--max-steps", "1", *flags]
    assert main([*argv, "--eval-split", "none"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"itune train: error: {flags[0]}: {data} streams (WebDataset shards)"), error
    assert error.endswith("drop it") and len(error.splitlines()) == 1, error


def write(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def test_visual_genome_drops_coco_karpathy_val_and_test_images(tmp_path):
    vg = tmp_path / "vg"
    regions = write(
        vg / "region_descriptions.json", [{"id": i, "regions": [{"phrase": f"thing {i}"}]} for i in range(5)]
    )
    coco = {0: 100, 1: 101, 2: 102, 3: None, 4: 104}  # VG image -> COCO image (3 is no COCO image)
    write(
        vg / "image_data.json",
        [{"image_id": i, "url": f"http://x/VG_100K/{i}.jpg", "coco_id": coco[i]} for i in range(5)],
    )
    for i in range(5):
        (vg / "VG_100K").mkdir(exist_ok=True)
        (vg / "VG_100K" / f"{i}.jpg").write_bytes(b"jpeg")
    splits = {100: "val", 101: "test", 102: "train", 104: "restval", 105: "test"}
    karpathy = write(
        tmp_path / "dataset_coco.json",
        {"images": [{"cocoid": c, "split": s, "filename": f"{c}.jpg", "sentences": []} for c, s in splits.items()]},
    )
    with pytest.warns(CocoOverlapWarning, match="--exclude-coco-split"):
        kept = load_captions(regions, check_counts=False)["train"]
    assert kept["image_id"] == ["0", "1", "2", "3", "4"]

    dropped = load_captions(regions, split="train", check_counts=False, exclude_coco_split=karpathy)
    assert dropped["image_id"] == ["2", "3", "4"]
    assert "dropped 2 Visual Genome images that are COCO Karpathy val/test images" in dropped.info.description
    shutil.copy(karpathy, vg / "dataset_coco.json")  # beside the regions: used by default
    with warnings.catch_warnings():
        warnings.simplefilter("error", CocoOverlapWarning)
        assert load_captions(regions, split="train", check_counts=False)["image_id"] == ["2", "3", "4"]
        assert len(load_captions(regions, split="train", check_counts=False, exclude_coco_split="none")) == 5
    from itune_hf.training.config import TrainingConfig
    from itune_hf.training.data import load_splits

    (vg / "dataset_coco.json").unlink()  # no Karpathy file: only "none" keeps the COCO images without a warning
    config = TrainingConfig(preset="itune-tiny-random", data=str(regions), output_dir=str(tmp_path / "o"),
                            exclude_coco_split="none", eval_split="none")  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error", CocoOverlapWarning)  # itune train read "none" as not given, and warned
        assert len(load_splits(config)[0]) == 5
    shutil.copy(karpathy, vg / "dataset_coco.json")
    (vg / "image_data.json").unlink()
    with pytest.raises(DataFormatError, match="needs VG's image_data.json"):
        load_captions(regions, split="train", check_counts=False)
    with pytest.raises(ValueError, match="filters Visual Genome data"):
        load_captions(karpathy, split="val", exclude_coco_split=karpathy)


# ------------------------------------------------------------------------------------------------------------------
# make-shards owns its output, survives a kill, and a shard is read once
# ------------------------------------------------------------------------------------------------------------------
def test_a_killed_make_shards_is_unreadable_until_the_same_command_finishes_it(shards, tmp_path, monkeypatch, capsys):
    from itune_hf.data import webdataset

    world = shards.parent / "world"
    out = tmp_path / "cut"
    argv = ["make-shards", "--data", str(world), "--output-dir", str(out), "--shard-size", "5"]
    real, calls = webdataset._add_sample, []

    def killed_in_the_third_shard(*args):
        calls.append(1)
        if len(calls) == 12:
            raise KeyboardInterrupt("killed")
        return real(*args)

    monkeypatch.setattr(webdataset, "_add_sample", killed_in_the_third_shard)
    assert main(argv) == 130  # the kill, as `itune` reports an interrupt: one line, exit 130
    monkeypatch.setattr(webdataset, "_add_sample", real)
    assert sorted(p.name for p in out.glob("*.tar")) == ["00000.tar", "00001.tar"]  # no cut third shard
    with pytest.raises(DataError, match="an unfinished itune make-shards output .* run the same itune make-shards"):
        load_captions(str(out), split="train")  # not a third of the data, streamed with one warning
    capsys.readouterr()
    assert main(argv) == 0  # the same command finishes it
    assert "resuming the unfinished shard set" in capsys.readouterr().err
    assert [p.read_bytes() for p in sorted(out.glob("*.tar"))] == [p.read_bytes() for p in sorted(shards.glob("*.tar"))]
    assert main(argv) == 2 and "holds a finished shard set (4 .tar shards)" in capsys.readouterr().err
    assert main([*argv, "--overwrite"]) == 0 and "--overwrite: removing 4 shard(s)" in capsys.readouterr().err


def test_make_shards_refuses_a_bad_caption_index_a_live_writer_and_an_empty_split(shards, tmp_path, capsys):
    from conftest import held_by_a_live_process

    world = shards.parent / "world"
    argv = ["make-shards", "--data", str(world), "--output-dir", str(tmp_path / "s")]
    with pytest.raises(SystemExit):
        main([*argv, "--caption-index", "-100"])  # refused when parsed: no IndexError, no cut tar
    assert "argument --caption-index: expected an integer >= 0, got '-100'" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()
    counts = [len(e["sentences"]) for e in json.loads((world / "dataset.json").read_text())["images"]]
    assert main([*argv, "--caption-index", str(max(counts))]) == 2  # past every image's captions
    assert f"have at most {max(counts)} caption(s); pass an index below" in capsys.readouterr().err
    assert not any((tmp_path / "s").glob("*.tar"))
    with held_by_a_live_process(tmp_path / "s", "itune make-shards") as pid:
        assert main(argv) == 2  # never two writers interleaving samples in one tar
    assert f"is in use by itune make-shards (pid {pid}" in capsys.readouterr().err
    only_train = tmp_path / "train-only.json"
    data = json.loads((world / "dataset.json").read_text())
    data["images"] = [dict(e, split="train") for e in data["images"]]
    only_train.write_text(json.dumps(data))
    argv = ["make-shards", "--data", str(only_train), "--image-root", str(world), "--split", "test"]
    assert main([*argv, "--output-dir", str(tmp_path / "t")]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_a_shard_reached_twice_through_a_link_is_read_once(shards, tmp_path):
    (tmp_path / "link").symlink_to(shards)
    with pytest.warns(BadShardWarning, match="4 shard\\(s\\) named twice"):
        stream = load_captions(f"{{{shards},{tmp_path / 'link'}}}/*.tar", split="train")
    assert stream.n_shards == 4 and stream.info.splits["train"].num_examples == 20  # not 8 shards, 40 samples


def test_make_shards_packs_only_images_under_the_image_root(shards, tmp_path, capsys):
    import shutil

    world = tmp_path / "world"
    shutil.copytree(shards.parent / "world", world)
    (tmp_path / "secret.txt").write_text("not for a shard")
    data = json.loads((world / "dataset.json").read_text())
    test_entries = [e for e in data["images"] if e["split"] == "test"]
    test_entries[0].update(filepath="..", filename="secret.txt")  # outside the root, and not an image
    (world / "dataset.json").write_text(json.dumps(data))
    argv = [
        "make-shards",
        "--data",
        str(world / "dataset.json"),
        "--split",
        "test",
        "--output-dir",
        str(tmp_path / "s"),
    ]
    assert main(argv) == 2
    assert f"is {world}/../secret.txt, outside the image root {world}" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()
    (world / "inside.txt").write_text("a text file inside the root")
    test_entries[0].update(filepath="", filename="inside.txt")
    (world / "dataset.json").write_text(json.dumps(data))
    assert main(argv) == 2
    assert "not an image file" in capsys.readouterr().err
    os.symlink(tmp_path / "secret.txt", world / "link.png")  # an image's name, a file outside the root
    test_entries[0].update(filename="link.png")
    (world / "dataset.json").write_text(json.dumps(data))
    assert main(argv) == 2
    assert "outside the image root" in capsys.readouterr().err


def test_a_member_that_inflates_past_its_bound_is_reported_not_read(tmp_path):
    import io
    import tarfile

    from itune_hf.data.webdataset import MAX_TEXT_MEMBER_BYTES, BadShardWarning, read_shard

    png = io.BytesIO()
    Image.new("RGB", (8, 8)).save(png, format="PNG")
    shard = tmp_path / "bomb.tar.gz"
    with tarfile.open(shard, "w:gz") as tar:
        for key, caption in (("a", b"a small caption"), ("b", b"\0" * (MAX_TEXT_MEMBER_BYTES + 1)), ("c", b"fine")):
            for name, payload in ((f"{key}.png", png.getvalue()), (f"{key}.txt", caption)):
                info = tarfile.TarInfo(name)
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    assert shard.stat().st_size < 20_000  # a small file on disk, a large member once inflated
    with pytest.warns(BadShardWarning, match=r"bomb.tar.gz: key 'b': member b.txt holds 1,048,577 bytes, over the"):
        rows = list(read_shard(shard))
    assert [row["image_id"] for row in rows] == ["a", "c"]
    with pytest.warns(BadShardWarning, match="member a.png holds"):  # a bound a caller sets
        assert [row["image_id"] for row in read_shard(shard, max_image_bytes=10)] == []


def test_shards_with_no_usable_pair_stop_training_in_one_line(shards, tmp_path, capsys):
    """It went on through empty epochs for ever (and a SIGTERM, which acts after a step, did not stop it)."""
    empty = tmp_path / "captions-only.tar"
    with tarfile.open(empty, "w") as tar:
        for key in range(3):
            add(tar, f"{key}.txt", b"a caption without its image")
    argv = ["train", "--output-dir", str(tmp_path / "o"), "--data", str(empty), *TINY, "--max-steps", "1"]
    with pytest.warns(BadShardWarning):
        assert main([*argv, "--eval-split", "none", "--num-workers", "0"]) == 2
    assert "shards hold no usable pair: every sample was skipped" in capsys.readouterr().err


def test_non_utf8_captions_are_skipped_by_name_and_hidden_members_ignored(shards, tmp_path):
    with tarfile.open(shards / "00000.tar") as source:
        image = source.extractfile("000000000.png").read()
    shard = tmp_path / "mixed.tar"
    with tarfile.open(shard, "w") as tar:
        add(tar, "._a.png", b"\x00\x05\x16\x07 a macOS resource fork")  # made key '' before: a bad sample
        add(tar, "a.png", image)
        add(tar, "a.txt", b"a good caption")
        add(tar, "b.png", image)
        add(tar, "b.txt", "caf\u00e9 au lait".encode("latin-1"))  # was read as "caf\ufffd au lait"
    with pytest.warns(BadShardWarning) as caught:
        rows = list(read_shard(shard))
    assert [row["image_id"] for row in rows] == ["a"]
    assert [str(w.message) for w in caught] == [f"{shard}: key 'b': its .txt caption is not UTF-8 text (invalid "
                                                "continuation byte at byte 3); skipped"]  # fmt: skip


def test_make_shards_leaves_out_images_without_captions(shards, tmp_path, capsys):
    """It wrote a shard, then failed with an IndexError on the first image without a caption."""
    world = shards.parent / "world"
    data = json.loads((world / "dataset.json").read_text())
    tests = [entry for entry in data["images"] if entry["split"] == "test"]
    tests[0]["sentences"] = []
    (tmp_path / "d.json").write_text(json.dumps(data))
    argv = ["make-shards", "--data", str(tmp_path / "d.json"), "--image-root", str(world), "--split", "test"]
    assert main([*argv, "--output-dir", str(tmp_path / "s")]) == 0
    assert f"1 of the {len(tests)} images have no caption and are left out" in capsys.readouterr().err
    assert len(list(read_shard(tmp_path / "s" / "00000.tar"))) == len(tests) - 1


def test_a_shard_cut_inside_a_member_header_is_reported_as_truncated(shards, tmp_path):
    """The stream reader ended quietly there: a shorter shard, no word of it."""
    whole = (shards / "00001.tar").read_bytes()
    with tarfile.open(shards / "00001.tar") as tar:
        third = [member for member in tar.getmembers() if member.name.endswith(".png")][2]
    cut = tmp_path / "cut.tar"
    cut.write_bytes(whole[: third.offset + 100])  # in the third sample's first header
    with pytest.warns(BadShardWarning, match=r"cut\.tar: truncated or corrupt tar after key .*the file ends 100 bytes"):
        rows = list(read_shard(cut))
    assert len(rows) == 1  # the second sample may have lost members after the cut: dropped with the rest

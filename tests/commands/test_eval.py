"""`itune eval` as users run it: a trained adapter directory, Karpathy or NoCaps data, one process or two."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from itune_hf.data import load_captions
from itune_hf.metrics import score_captions

from conftest import synthetic_world, train_tiny_adapter

BIN = Path(sys.executable).parent
FAST = "BLEU,ROUGE_L,CIDEr"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return synthetic_world(tmp_path_factory, "eval-world", num_images=40, seed=5)


@pytest.fixture(scope="module")
def trained(world, tmp_path_factory):
    return train_tiny_adapter(world, tmp_path_factory.mktemp("eval-model") / "adapter", steps=6)


def itune(*args, env=None, launcher=None):
    command = [*(launcher or [str(BIN / "itune")]), *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})})


def last_json_line(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_eval_writes_coco_results_captions_and_metrics_and_prints_the_scores_last(world, trained, tmp_path):
    out = tmp_path / "eval"
    result = itune(
        "eval", "--model", trained, "--data", world, "--split", "test", "--num-beams", 2, "--max-new-tokens", 5,
        "--metrics", f"{FAST},SPICE", "--output-dir", out,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    printed = last_json_line(result.stdout)
    assert {f"Bleu_{n}" for n in range(1, 5)} | {"ROUGE_L", "CIDEr", "SPICE"} == set(printed)
    assert isinstance(printed["SPICE"], float) or printed["SPICE"].startswith("unavailable: ")

    test = load_captions(str(world))["test"]
    results = json.loads((out / "results.json").read_text())  # COCO results format
    assert sorted(r["image_id"] for r in results) == sorted(test["image_id"])
    assert all(set(r) == {"image_id", "caption"} and isinstance(r["caption"], str) for r in results)
    lines = [json.loads(line) for line in (out / "captions.jsonl").read_text().splitlines()]
    assert len(lines) == len(test) and all(Path(line["image_path"]).is_file() for line in lines)
    report = json.loads((out / "metrics.json").read_text())
    assert report["scores"] == printed and report["num_beams"] == 2 and report["images"] == len(test)

    # The printed scores are those of the written captions, scored independently here.
    references = dict(zip(test["image_id"], test["captions"]))
    rescored = score_captions({r["image_id"]: r["caption"] for r in results}, references, metrics=FAST.split(","))
    assert all(abs(rescored[k] - printed[k]) < 1e-12 for k in rescored)

    # `itune score` on the written results agrees too (COCO annotations written from the same references).
    annotations = {
        "images": [{"id": i} for i in references],
        "annotations": [{"image_id": i, "caption": c} for i, refs in references.items() for c in refs],
    }
    (tmp_path / "refs.json").write_text(json.dumps(annotations))
    scored = itune("score", out / "results.json", tmp_path / "refs.json", "--metrics", FAST)
    assert scored.returncode == 0, scored.stderr
    assert all(abs(last_json_line(scored.stdout)[k] - printed[k]) < 1e-12 for k in rescored)


@pytest.mark.slow
def test_nocaps_data_gets_a_cider_per_domain(world, trained, tmp_path):
    test = load_captions(str(world))["test"]
    domains = ["in-domain", "near-domain", "out-domain"]
    nocaps = {
        "images": [{"id": n, "file_name": path, "domain": domains[n % 3]} for n, path in enumerate(test["image_path"])],
        "annotations": [
            {"image_id": n, "caption": caption, "id": 10 * n + k}
            for n, captions in enumerate(test["captions"])
            for k, caption in enumerate(captions)
        ],
    }
    (tmp_path / "nocaps_val_4500_captions.json").write_text(json.dumps(nocaps))
    out = tmp_path / "eval"
    result = itune(
        "eval", "--model", trained, "--data", tmp_path / "nocaps_val_4500_captions.json", "--image-root", "/",
        "--num-beams", 1, "--max-new-tokens", 5, "--metrics", FAST, "--output-dir", out,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    printed = last_json_line(result.stdout)
    report = json.loads((out / "metrics.json").read_text())
    assert sorted(report["domains"]) == domains

    captions = {r["image_id"]: r["caption"] for r in json.loads((out / "results.json").read_text())}
    for index, domain in enumerate(domains):
        members = [n for n in captions if n % 3 == index]
        references = {n: nocaps_refs for n, nocaps_refs in enumerate(test["captions"]) if n in members}
        expected = score_captions({n: captions[n] for n in members}, references, metrics=FAST.split(","))
        assert report["domains"][domain] == expected  # each domain scored on its own, its own CIDEr-D idf
        assert printed[f"CIDEr_{domain}"] == expected["CIDEr"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_eval_under_accelerate_with_two_processes_equals_one_process(world, trained, tmp_path):
    common = ["--model", trained, "--data", world, "--split", "train", "--max-images", 7, "--batch-size", 2,
              "--num-beams", 1, "--max-new-tokens", 5, "--metrics", FAST]  # fmt: skip
    single = itune("eval", *common, "--output-dir", tmp_path / "one")
    assert single.returncode == 0, single.stderr[-3000:]
    launcher = [
        str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
        "-m", "itune_hf.cli",
    ]  # fmt: skip
    double = itune(
        "eval", *common, "--output-dir", tmp_path / "two", launcher=launcher, env={"ACCELERATE_USE_CPU": "true"}
    )
    assert double.returncode == 0, double.stderr[-3000:]
    assert double.stdout.count('"CIDEr"') == 1  # only the main process reports
    one = json.loads((tmp_path / "one" / "results.json").read_text())
    two = json.loads((tmp_path / "two" / "results.json").read_text())
    assert len(two) == 7 and two == one  # no image lost or doubled, in the split's order (it was by rank)
    assert last_json_line(single.stdout) == last_json_line(double.stdout)


@pytest.mark.slow  # a subprocess per command
def test_eval_errors_name_the_problem(world, trained, tmp_path):
    missing = itune("eval", "--model", tmp_path / "nope", "--data", world, "--split", "test")
    assert missing.returncode != 0 and "nope" in missing.stderr
    several = itune("eval", "--model", trained, "--data", world, "--split", "bogus", "--metrics", FAST)
    assert several.returncode != 0 and "split" in several.stderr.lower()


def world_with_a_bad_image(world, tmp_path, split="test", index=0):
    """A copy of `world` whose `index`-th `split` image is a truncated file; returns (dataset.json, that path)."""
    import shutil

    copy = tmp_path / "data"
    shutil.copytree(world.parent, copy)
    bad = Path(load_captions(copy / "dataset.json", split=split)[index]["image_path"])
    bad.write_bytes(bad.read_bytes()[:60])  # the header survives, the pixel data does not
    return copy / "dataset.json", bad


def test_eval_skips_an_unreadable_image_scores_the_rest_and_says_so(world, trained, tmp_path, capsys):
    """An undecodable image does not stop `itune eval`: it is reported and skipped."""
    from itune_hf.cli import main

    data, bad = world_with_a_bad_image(world, tmp_path)
    test_ids = load_captions(data, split="test")["image_id"]
    out = tmp_path / "eval"
    args = ["eval", "--model", trained, "--data", data, "--split", "test", "--num-beams", 1, "--max-new-tokens", 3]
    code = main([str(a) for a in [*args, "--metrics", "BLEU", "--output-dir", out]])
    stderr = capsys.readouterr().err
    assert code == 1
    assert f"skipped {bad}: unreadable image data" in stderr
    assert f"1 of {len(test_ids)} images could not be read" in stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["images"] == len(test_ids) - 1 and metrics["skipped_images"] == 1
    assert metrics["skipped"][0]["image_path"] == str(bad) and "unreadable" in metrics["skipped"][0]["reason"]
    assert metrics["scored_over"] == f"the {len(test_ids) - 1} captioned images (1 unreadable skipped)"
    captioned = [json.loads(line)["image_path"] for line in (out / "captions.jsonl").read_text().splitlines()]
    assert len(captioned) == len(test_ids) - 1 and str(bad) not in captioned


def test_a_killed_eval_never_leaves_new_captions_beside_old_scores_and_a_foreign_dir_is_refused(
    world, trained, tmp_path, capsys, monkeypatch
):
    from itune_hf.cli import main
    from itune_hf.commands import eval as eval_command

    out = tmp_path / "eval"
    args = ["eval", "--model", trained, "--data", world, "--split", "test", "--max-new-tokens", 2, "--metrics", "BLEU"]
    args = [str(a) for a in [*args, "--output-dir", out]]
    assert main([*args, "--num-beams", "1"]) == 0
    real = eval_command.atomic_write_json

    def killed_before_the_scores(path, value, **kwargs):
        if Path(path).name == "metrics.json":
            raise KeyboardInterrupt("killed")
        return real(path, value, **kwargs)

    monkeypatch.setattr(eval_command, "atomic_write_json", killed_before_the_scores)
    assert main([*args, "--num-beams", "2"]) == 130  # the kill, as `itune` reports an interrupt: one line, exit 130
    # no scores until a run finishes: never the new results.json beside the old metrics.json (of other beams)
    assert (out / "results.json").is_file() and not (out / "metrics.json").exists()
    monkeypatch.setattr(eval_command, "atomic_write_json", real)

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert main([*args[:-1], str(tmp_path / "mine"), "--num-beams", "1"]) == 2
    assert "holds files itune eval did not write (notes.txt)" in capsys.readouterr().err

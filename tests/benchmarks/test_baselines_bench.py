"""`benchmarks/bench_quality.py` run as a user runs it, at the tiniest size: it trains with the package's loop, scores
the test split and writes the comparison and ablation tables (numbers mean nothing at this size; never asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from script_support import load_script

pytestmark = pytest.mark.slow  # learning runs, subprocesses, kills or benchmarks: only make test-slow runs them

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_quality.py"


def bench_module():
    return load_script(SCRIPT)


def test_quality_benchmark_writes_its_tables(tmp_path):
    out = tmp_path / "quality.json"
    command = [sys.executable, str(SCRIPT), "--tiny", "--threads", "1", "--json", str(out), "--data-dir",
               str(tmp_path / "data"), "--out-dir", str(tmp_path / "runs"), "--methods", "clipcap-mlp,ituning,xgpt",
               "--ablations", "final-norm"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| method | seeds | CIDEr" in result.stdout and "| ablation: final-norm |" in result.stdout
    assert "Not available" not in result.stdout  # every ablation is a setting
    data = json.loads(out.read_text())
    tables = data["tables"]
    assert list(tables["methods"]) == ["ClipCap, MLP mapper", "I-Tuning, all layers", "XGPT from scratch"]
    assert list(tables["final-norm"]) == ["without the final layer norm", "with the final layer norm"]
    runs = data["runs"]
    assert len(runs) == 5 and all(0 <= run["CIDEr"] and run["ms_per_step"] > 0 for run in runs)
    # the ablation's default row trains what the I-Tuning row trained: one run, reused and said so
    without = next(run for run in runs if run["label"] == "without the final layer norm")
    assert without["same_run_as"] == "methods: I-Tuning, all layers"
    assert sum("same_run_as" in run for run in runs) == 1
    assert "5 rows (4 distinct)" in result.stdout
    assert all("load_before" in run and "load_after" in run for run in runs)  # timings carry the machine load
    assert tables["methods"]["ClipCap, MLP mapper"]["trainable_parameters"] == 56_800
    norm = tables["final-norm"]
    assert (
        norm["without the final layer norm"]["trainable_parameters"]
        == norm["with the final layer norm"]["trainable_parameters"]
    )
    assert not any((tmp_path / "runs").iterdir())  # trained models are deleted once scored


def test_the_retrieval_baseline_and_the_constant_caption_sit_beside_the_trained_rows(tmp_path):
    out = tmp_path / "quality.json"
    command = [sys.executable, str(SCRIPT), "--tiny", "--threads", "1", "--json", str(out), "--data-dir",
               str(tmp_path / "data"), "--out-dir", str(tmp_path / "runs")]  # fmt: skip
    result = subprocess.run([*command, "--methods", "retrieval,ituning-preset"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    assert list(data["tables"]["methods"]) == [
        "Nearest-neighbour retrieval (no training)",
        "I-Tuning, the preset's defaults",
    ]
    retrieval = next(run for run in data["runs"] if run["label"].startswith("Nearest"))
    assert retrieval["trainable_parameters"] == 0 and retrieval["final_loss"] is None
    world = json.loads((tmp_path / "data" / "hard" / "dataset.json").read_text())
    training = {s["raw"] for image in world["images"] if image["split"] == "train" for s in image["sentences"]}
    assert retrieval["example_caption"] in training  # a training image's caption, retrieved
    assert data["constant_caption"]["caption"] in training and "CIDEr" in data["constant_caption"]
    assert "the best constant caption (chosen on the training split)" in result.stdout


def test_quality_benchmark_refuses_unknown_methods(tmp_path):
    result = subprocess.run([sys.executable, str(SCRIPT), "--methods", "blip"], capture_output=True, text=True)
    assert result.returncode == 2 and "--methods: unknown blip" in result.stderr
    command = [sys.executable, str(SCRIPT), "--methods", "ituning,clipcap-mlp", "--vision-tower", "pretrained"]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 2 and "takes that tower; drop clipcap-mlp from --methods" in result.stderr
    result = subprocess.run([sys.executable, str(SCRIPT), "--methods", "xgpt-pretrained"], capture_output=True,
                            text=True)  # fmt: skip
    assert result.returncode == 2 and "give its start with --xgpt-init DIR" in result.stderr
    result = subprocess.run([sys.executable, str(SCRIPT), "--scale", "demo-resnet", "--methods", "xgpt"],
                            capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 2 and "add --vision-tower pretrained" in result.stderr


def test_xgpt_after_pretraining_starts_from_its_seeds_model_on_the_presets_own_tower(tmp_path):
    """xgpt-pretrained fine-tunes the `--xgpt-init` model of each seed; at --scale demo-resnet the XGPT rows read
    xgpt-demo-resnet's own tower (the pre-trained one the I-Tuning rows are given as --vision-model)."""
    bench = bench_module()
    start = str(tmp_path / "stage1-{seed}")
    args = bench.parse_args(["--scale", "demo-resnet", "--vision-tower", "pretrained", "--methods",
                             "ituning,xgpt,xgpt-pretrained", "--xgpt-init", start])  # fmt: skip
    args.vision_model = "/cache/vision-towers/demo-resnet-tiny-0123/tower"
    runs = bench.method_runs(args.scale, args.methods, args.xgpt_init)
    specs = {run["label"]: bench.spec_of(run, 2, args, tmp_path / "dataset.json", tmp_path / "cache") for run in runs}
    pretrained = specs["XGPT after pre-training"]["config"]
    assert pretrained["init_model"] == str(tmp_path / "stage1-2") and pretrained["preset"] == "xgpt-demo-resnet"
    assert "vision_model" not in pretrained and "init_model" not in specs["XGPT from scratch"]["config"]
    assert specs["I-Tuning, all layers"]["config"]["vision_model"] == args.vision_model
    assert len({bench.run_key(run, "pretrained") for run in runs}) == 3


def test_every_ablation_row_is_a_setting_itune_train_accepts():
    from itune_hf.training.config import TrainingConfig

    bench = bench_module()
    assert bench.NOT_AVAILABLE == {}
    runs = bench.ablation_runs("tiny", list(bench.ABLATIONS))
    assert {run["table"] for run in runs} == set(bench.ABLATIONS)
    tokens = {run["label"]: run["overrides"]["visual_tokens"] for run in runs if run["table"] == "visual-tokens"}
    assert tokens == {"all tokens (CLS + patches)": "all", "CLS only": "cls", "patches only": "patches"}
    norms = [run["overrides"].get("final_norm") for run in runs if run["table"] == "final-norm"]
    assert norms == [None, True]  # "without" is the benchmark towers' own output (CLIP-style: before the norm)
    for run in runs:
        TrainingConfig(output_dir="unused", preset=run["preset"], **run["overrides"])


def test_rows_that_train_the_same_thing_share_one_run():
    bench = bench_module()
    runs = bench.ablation_runs("demo", list(bench.ABLATIONS)) + bench.method_runs("demo", ["ituning", "ituning-drop"])
    keys = {}
    for run in runs:
        keys.setdefault(bench.run_key(run, "pretrained"), []).append(f"{run['table']}: {run['label']}")
    assert len(runs) == 22 and len(keys) == 14  # every ablation's default row is the all-layer I-Tuning run
    shared = max(keys.values(), key=len)
    assert "methods: I-Tuning, all layers" in shared and "init: zero init" in shared and len(shared) == 8
    halved = keys[bench.run_key(runs[-1], "pretrained")]
    assert halved == ["dropping: first layer 15 (15 of 30 layers)", "methods: I-Tuning, lower half dropped"]
    assert bench.run_key(runs[0], "random") != bench.run_key(runs[0], "pretrained")


def test_parallel_runs_keep_the_row_order_and_share_identical_runs(monkeypatch, tmp_path):
    """`--jobs N` trains the distinct runs N at a time (fresh processes) and finishes in any order; the rows come out
    in the order of the serial study, and a row that trains what another trained reuses its run."""
    import threading
    import time

    bench = bench_module()
    started = []

    def fake_train_and_score(spec, args):
        started.append(threading.current_thread().name)
        assert spec["config"]["feature_cache"] == str(caches[spec["config"]["preset"]])  # its own tower's states
        time.sleep(0.2 if spec["config"]["seed"] == 0 else 0.0)  # seed 0 finishes last
        return {"CIDEr": spec["config"]["seed"] / 10, "ms_per_step": 1.0, "load_before": 0.0, "load_after": 0.0}

    monkeypatch.setattr(bench, "train_and_score", fake_train_and_score)
    args = bench.parse_args(["--scale", "tiny", "--methods", "ituning,xgpt", "--ablations", "init", "--seeds", "2",
                             "--jobs", "3", "--json", str(tmp_path / "q.json")])  # fmt: skip
    args.vision_model = None
    runs = bench.method_runs("tiny", args.methods) + bench.ablation_runs("tiny", args.ablations)
    caches = {run["preset"]: tmp_path / f"cache-{run['preset']}" for run in runs}  # as tower_caches maps them
    assert len(set(caches)) == 2
    results = bench.run_all(runs, args, tmp_path / "dataset.json", caches)
    labels = [(r["label"], r["seed"]) for r in results]
    assert labels == [(run["label"], seed) for seed in (0, 1) for run in runs]
    assert len(started) == 6 and len(set(started)) > 1  # 3 distinct runs x 2 seeds, on several workers
    zero_init = [r for r in results if r["label"] == "zero init"]
    assert [r["same_run_as"] for r in zero_init] == ["methods: I-Tuning, all layers"] * 2
    assert [r["CIDEr"] for r in zero_init] == [0.0, 0.1]
    assert len(json.loads((tmp_path / "q.json").read_text())["runs"]) == 6  # the partial file: each trained run


def test_the_quality_benchmark_names_a_method_its_scale_lacks():
    bench = bench_module()
    with pytest.raises(SystemExit, match="--methods clipcap-mlp: no preset at --scale demo-resnet"):
        bench.method_runs("demo-resnet", ["ituning", "clipcap-mlp"])


def test_every_scale_can_generate_its_world_when_no_corpus_is_given(monkeypatch, tmp_path):
    """Without --data every scale draws a synthetic world (the real pieces on the hard world too), at its pixel size."""
    bench = bench_module()
    drawn = {}
    monkeypatch.setattr("itune_hf.data.make_synthetic", lambda directory, **kwargs: drawn.update(kwargs))
    monkeypatch.setattr(bench, "tower_caches", lambda *args: {})
    for scale in bench.PRESETS:
        args = bench.parse_args(["--scale", scale, "--methods", "ituning", "--data-dir", str(tmp_path / scale)])
        bench.prepare_world(args, [])
        assert drawn["image_size"] == bench.IMAGE_SIZE[scale] and drawn["world"] == "hard"

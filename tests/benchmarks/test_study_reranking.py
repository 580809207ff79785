"""`benchmarks/study_reranking.py`: the choices among a beam's captions (MBR, consensus with neighbours' captions,
the oracle) on hand-made cases whose answers are plain, and one run of the script over a tiny trained captioner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from script_support import load_script

from itune_hf.metrics.cider import DocumentFrequency

from conftest import synthetic_world, train_tiny_adapter

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "study_reranking.py"
CORPUS = [["a red apple fruit"], ["a green pear fruit"], ["a blue car vehicle"], ["a stop sign roadsign"]]


@pytest.fixture(scope="module")
def study():
    return load_script(SCRIPT)


@pytest.fixture(scope="module")
def frequency():
    return DocumentFrequency.from_references(CORPUS)


def test_captions_are_compared_as_the_metrics_tokenise_them(study):
    assert study.tokens(["Red Apple, fruit.", "A dog's toy."]) == ["red apple fruit", "a dog 's toy"]


def test_mbr_picks_the_candidate_the_others_agree_with(study, frequency):
    beam = ["a car", "a red apple fruit", "red apple", "apple fruit"]  # the likeliest agrees with none of the others
    assert study.mbr_choice(beam, frequency) == "a red apple fruit"
    assert study.mbr_choice(["only one"], frequency) == "only one"


def test_consensus_picks_the_candidate_closest_to_the_neighbours_captions(study, frequency):
    beam = ["a red apple fruit", "a blue car vehicle"]
    assert study.consensus_choice(beam, ["blue car vehicle", "a car"], frequency) == "a blue car vehicle"
    assert study.consensus_choice(beam, ["red apple", "a stop sign"], frequency) == "a red apple fruit"


def test_the_oracle_takes_each_images_best_candidate_against_its_own_references(study):
    nbest = {"x": ["a car", "a red apple"], "y": ["a stop sign", "a pear"], "z": ["a pear", "a pear"]}
    references = {"x": ["a red apple"], "y": ["a stop sign"], "z": ["a green pear"]}
    assert study.oracle_choices(nbest, references) == {"x": "a red apple", "y": "a stop sign", "z": "a pear"}


@pytest.mark.slow
@pytest.mark.usefixtures("fresh_accelerator_state")  # itune train runs in this process
def test_the_study_runs_over_a_trained_captioner_and_its_feature_cache(study, tmp_path_factory, tmp_path):
    from itune_hf.cli import main

    world = synthetic_world(tmp_path_factory, "rerank-world", num_images=16, seed=5)
    run = train_tiny_adapter(world, tmp_path / "run", steps=2)
    cache = tmp_path / "cache"
    assert main(["cache-features", "--preset", "itune-tiny-random", "--data", str(world), "--output-dir", str(cache),
                 "--dtype", "float32"]) == 0  # fmt: skip
    out = tmp_path / "report.json"
    report = study.main([
        "--model", str(run), "--data", str(world), "--split", "test", "--feature-cache", str(cache),
        "--num-beams", "3", "--neighbours", "1,2", "--max-new-tokens", "5", "--json", str(out),
    ])  # fmt: skip
    assert json.loads(out.read_text()) == report
    rows = report["rows"]
    assert set(rows) == {"beam_best", "oracle", "mbr", "consensus_k1", "consensus_k2", "retrieval"}
    assert rows["beam_best"]["same_as_beam_best"] == report["images"] > 0
    # the oracle reads the references: no choice from the same beam scores above it
    assert all(rows["oracle"]["CIDEr"] >= rows[name]["CIDEr"] - 1e-9 for name in ("beam_best", "mbr", "consensus_k1"))
    assert "Object_F1" in rows["mbr"]  # a generated world records its scenes: the grounded metric is reported

"""The `evaluate` metric module loads from its local path with no network and gives `score_captions`' scores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from itune_hf.metrics import EVALUATE_MODULE_DIR, FAST_METRICS, score_captions
from itune_hf.metrics.synthetic import make_corpus

SCRIPT = textwrap.dedent(
    """
    import json, socket, sys

    def no_network(*args, **kwargs):
        raise OSError("network access attempted")

    socket.socket.connect = no_network
    socket.create_connection = no_network

    import evaluate

    data = json.load(sys.stdin)
    module = evaluate.load(data["path"])
    result = module.compute(predictions=data["predictions"], references=data["references"])
    with_idf = module.compute(
        predictions=data["predictions"], references=data["references"], metrics=["CIDEr"], idf_corpus=data["corpus"]
    )
    single = module.compute(predictions=data["predictions"], references=[refs[0] for refs in data["references"]])
    print(json.dumps({"name": module.name, "result": result, "with_idf": with_idf, "single": single}))
    """
)


@pytest.mark.slow
def test_evaluate_load_offline_gives_the_same_scores(tmp_path):
    predictions, references = make_corpus(30, 5, seed=3)
    _, corpus = make_corpus(40, 5, seed=4)
    ids = list(references)
    payload = {
        "path": EVALUATE_MODULE_DIR,
        "predictions": [predictions[k] for k in ids],
        "references": [references[k] for k in ids],
        "corpus": list(corpus.values()),
    }
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_EVALUATE_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    env["HF_HOME"] = str(tmp_path / "hf_home")  # a fresh cache: nothing to fall back on
    completed = subprocess.run(
        [sys.executable, "-c", SCRIPT], input=json.dumps(payload), capture_output=True, text=True, env=env, timeout=300
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    output = json.loads(completed.stdout.strip().splitlines()[-1])
    assert output["name"] == "coco_caption"
    expected = score_captions(predictions, references, metrics=FAST_METRICS)
    assert list(output["result"]) == list(expected)
    for name, value in expected.items():
        assert output["result"][name] == pytest.approx(value, rel=1e-12), name
    expected_idf = score_captions(predictions, references, metrics=["CIDEr"], idf_corpus=list(corpus.values()))
    assert output["with_idf"]["CIDEr"] == pytest.approx(expected_idf["CIDEr"], rel=1e-12)
    # one reference string per prediction, as evaluate's bleu and rouge take it
    expected_single = score_captions(predictions, {k: refs[:1] for k, refs in references.items()}, metrics=FAST_METRICS)
    for name, value in expected_single.items():
        assert output["single"][name] == pytest.approx(value, rel=1e-12), name

"""METEOR without Java against pycocoevalcap's jar: time (JVM start included), equality, what it adds to itune score.

Corpora (fixed seeds): COCO-like captions of `make_corpus` through the PTB tokenizer as `itune score` sends them
(5,000 x 5: a COCO Karpathy test split's size; 500 x 5: a validation split's), 1,000 x 5 raw captions dense with
punctuation and unicode (`hard=True`), 1,000 x 5 captions made to match through every module
(`make_meteor_corpus`), and with `--clipart DATASET` a clip-art test split (real human captions; each image
"predicted" by another image's caption). Each side scores each corpus from a fresh start: the jar in a new
`pycocoevalcap.meteor.meteor.Meteor()` (JVM start and paraphrase loading included), ours in a new `MeteorScorer()`
(its cache already built: the first run on a machine builds it once, timed separately with `--time-cache-build`).
Then `itune score` runs as a user runs it, in fresh processes, with `--metrics BLEU,ROUGE_L,CIDEr` and with METEOR
added: the difference is what METEOR adds.

    python benchmarks/bench_meteor.py --clipart outputs/clipart/dataset.json --output benchmarks/records/meteor-cpu.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

from bench_metrics import itune_score_command, machine, write_coco_files  # noqa: E402

from itune_hf.metrics import tokenize_captions  # noqa: E402
from itune_hf.metrics.meteor import MeteorScorer  # noqa: E402
from itune_hf.metrics.meteor.corpus import make_meteor_corpus  # noqa: E402
from itune_hf.metrics.synthetic import make_corpus  # noqa: E402


def _tokenized(predictions, references):
    ids = list(references)
    tokens = tokenize_captions([predictions[i] for i in ids] + [r for i in ids for r in references[i]])
    rest = iter(tokens[len(ids) :])
    return dict(zip(ids, tokens)), {i: [next(rest) for _ in references[i]] for i in ids}


def _clipart(path: Path):
    """The test split's clean captions; each image "predicted" by another image's first caption (a derangement)."""
    images = [i for i in json.loads(path.read_text())["images"] if i.get("split") == "test"]
    references = {n: [s["raw"] for s in image["sentences"]] for n, image in enumerate(images)}
    order = list(references)
    random.Random(0).shuffle(order)
    return {order[n]: references[order[n - 1]][0] for n in range(len(order))}, references


def corpora(args, data):
    large, small, middle = args.images, args.images // 10, args.images // 5
    found = {
        f"COCO-like {large:,} x 5, PTB-tokenised": _tokenized(*make_corpus(large, 5, seed=0)),
        f"COCO-like {small:,} x 5, PTB-tokenised": _tokenized(*make_corpus(small, 5, seed=1)),
        f"edge cases {middle:,} x 5, raw": make_corpus(middle, 5, seed=0, hard=True),
        f"every module {middle:,} x 5": make_meteor_corpus(middle, 5, seed=0, data=data),
    }
    if args.clipart:
        found["clip-art test split, PTB-tokenised"] = _tokenized(*_clipart(Path(args.clipart)))
    line = lambda text: text.replace("\n", " ").replace("\r", " ")  # noqa: E731 (the jar reads one line per caption)
    return {
        name: ({k: line(p) for k, p in predictions.items()}, {k: [line(r) for r in rs] for k, rs in references.items()})
        for name, (predictions, references) in found.items()
    }


def _jar(gts, res):
    from pycocoevalcap.meteor.meteor import Meteor

    start = time.perf_counter()
    meteor = Meteor()
    score, per_image = meteor.compute_score(gts, res)
    seconds = time.perf_counter() - start
    del meteor
    return seconds, score, per_image


def _ours(gts, res):
    start = time.perf_counter()
    score, per_image = MeteorScorer().compute_score(gts, res)
    return time.perf_counter() - start, score, per_image


def _itune_score(predictions, references, metrics: str, runs: int) -> float:
    with tempfile.TemporaryDirectory() as directory:
        pred_path, ref_path = write_coco_files(predictions, references, Path(directory))
        command = [*itune_score_command(), "score", str(pred_path), str(ref_path), "--metrics", metrics]
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        seconds = []
        for _ in range(runs):
            start = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True, env=env)
            seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def _cache_build_seconds() -> dict:
    from itune_hf.metrics.meteor import language_data

    with tempfile.TemporaryDirectory() as cache:
        os.environ["ITUNE_CACHE"], previous = cache, os.environ.get("ITUNE_CACHE")
        try:
            start = time.perf_counter()
            data = language_data.load_language_data(language_data.meteor_sources())
            seconds = time.perf_counter() - start
            size = sum(p.stat().st_size for p in data.folder.iterdir())
        finally:
            os.environ.pop("ITUNE_CACHE") if previous is None else os.environ.update(ITUNE_CACHE=previous)
    return {"seconds": round(seconds, 1), "megabytes": round(size / 1e6, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clipart", help="a make-clipart dataset.json: also its test split")
    parser.add_argument("--images", type=int, default=5000, help="the largest corpus (the others: a tenth, a fifth)")
    parser.add_argument("--runs", type=int, default=3, help="fresh runs per side and corpus (median reported)")
    parser.add_argument("--no-jar", action="store_true", help="time ours only (where Java cannot run)")
    parser.add_argument("--time-cache-build", action="store_true", help="also time building the cache from scratch")
    parser.add_argument("--output", help="write the record here (JSON)")
    args = parser.parse_args()
    data = MeteorScorer().data  # builds the cache if this machine has none
    record = {
        "what": __doc__.splitlines()[0],
        "command": "python benchmarks/bench_meteor.py " + " ".join(sys.argv[1:]),
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "load_before": os.getloadavg()[0],
        "corpora": {},
    }
    for name, (predictions, references) in corpora(args, data).items():
        gts, res = references, {k: [predictions[k]] for k in references}
        ours = [_ours(gts, res) for _ in range(args.runs)]
        ours_seconds = statistics.median(r[0] for r in ours)
        row = {"images": len(gts), "ours_seconds": round(ours_seconds, 2), "METEOR": ours[0][1]}
        if not args.no_jar:
            jar = [_jar(gts, res) for _ in range(args.runs)]
            jar_seconds = statistics.median(r[0] for r in jar)
            row["jar_seconds"], row["speed_up"] = round(jar_seconds, 2), round(jar_seconds / ours_seconds, 2)
            differences = (abs(a - b) for a, b in zip(jar[0][2], ours[0][2]))
            row["largest_difference"] = max(abs(jar[0][1] - ours[0][1]), *differences)
        if len(gts) < args.images:  # what METEOR adds to `itune score`, as a user runs it
            without = _itune_score(predictions, references, "BLEU,ROUGE_L,CIDEr", args.runs)
            with_meteor = _itune_score(predictions, references, "BLEU,ROUGE_L,CIDEr,METEOR", args.runs)
            row["itune_score_seconds"] = {"without METEOR": round(without, 2), "with METEOR": round(with_meteor, 2)}
            row["meteor_adds_seconds"] = round(with_meteor - without, 2)
        record["corpora"][name] = row
        print(name, json.dumps(row), flush=True)
    if args.time_cache_build:
        record["cache_build"] = _cache_build_seconds()
        print("cache build", record["cache_build"])
    record["load_after"] = os.getloadavg()[0]
    if args.output:
        Path(args.output).write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

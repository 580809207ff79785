"""Score saved captions again with other metrics, beside their controls: `itune eval`'s `results.json` files (or any
COCO results file) on a dataset split, each with the shuffled-image control `itune eval --shuffled-control` uses (the
same derangement of the same images) and, once per split, a constant caption written for every image. For metrics
added after the captions were made (CHAIR), without captioning again.

    python benchmarks/rescore_captions.py --data outputs/clipart/dataset.json --split test \\
        --metrics CIDEr,ContentWords,CHAIR --constant "A flag." NAME=RUN/eval-test/results.json ...

Prints one JSON object: name -> {"scores", "shuffled"}, and "constant" -> scores (a metric with no value: null).
"""

from __future__ import annotations

import argparse
import json

from itune_hf.data import load_captions
from itune_hf.data.coco_results import read_coco_results
from itune_hf.data.scenes import scenes_of_data
from itune_hf.evaluation import shuffled_control
from itune_hf.metrics import score_captions
from itune_hf.utils.files import without_nan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", metavar="NAME=RESULTS.json")
    parser.add_argument("--data", required=True)
    parser.add_argument("--split", default="test")
    parser.add_argument("--metrics", default="CIDEr,ContentWords,CHAIR")
    parser.add_argument("--constant", default=None, help="A constant caption to score for every image too.")
    args = parser.parse_args()
    metrics = args.metrics.split(",")
    rows = load_captions(args.data, split=args.split, allow_outside_root=True)
    references = {key: list(refs) for key, refs in zip(rows["image_id"], rows["captions"])}
    records = scenes_of_data(args.data)
    report: dict = {}
    for item in args.results:
        name, path = item.split("=", 1)
        captions = {str(key): caption for key, caption in read_coco_results(path).items()}
        refs = {key: references[key] for key in captions}  # itune eval's order: the captioned images
        report[name] = {
            "scores": score_captions(captions, refs, metrics=metrics, scenes=records),
            "shuffled": shuffled_control(captions, refs, metrics=metrics, scenes=records),
        }
    if args.constant:
        constant = dict.fromkeys(references, args.constant)
        report["constant"] = score_captions(constant, references, metrics=metrics, scenes=records)
    print(json.dumps(without_nan(report), indent=1))  # a metric with no value (NaN) as null


if __name__ == "__main__":
    main()

"""How much of the gap to nearest-neighbour retrieval a better choice among a captioner's own beam could close.

A trained captioner captions one split with beam search and keeps the whole beam (`--num-beams N`: N finished
captions per image, `itune_hf.evaluation.generate_captions(num_return_sequences=N)`). One caption per image is then
chosen from that n-best list in four ways, and each choice is scored like `itune eval` scores (CIDEr-D and, on a
clip-art corpus, the content-word F1):

- `beam_best`: the beam's most likely caption (what `itune eval --num-beams N` reports);
- `oracle`: the candidate with the best CIDEr-D against the image's own references. It reads the answers, so it is
  no method: it bounds what any reranker of this beam could reach;
- `mbr`: minimum Bayes risk: the candidate that agrees most with the other candidates of its beam (mean CIDEr-D to
  each, document frequencies of the training references). It needs nothing but the model;
- `consensus_kK`: the candidate that agrees most with the captions of the K training images whose pooled tower
  states are most similar to the image's (consensus reranking, Devlin et al. 2015, applied to generated candidates
  instead of retrieved ones). It needs the training captions and the feature cache, as retrieval does.

Beside them, the retrieval baseline (the nearest training image's first caption, `itune_hf.vision.retrieval`) on
the same images. Agreement is CIDEr-D over the captions as the metrics tokenise them.

    python benchmarks/study_reranking.py --model RUN --data outputs/clipart/dataset.json --split val \\
        --feature-cache outputs/cache-lite0 --num-beams 8 --neighbours 1,3,10 --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Mapping, Sequence

import numpy as np


def tokens(texts: Sequence[str]) -> list[str]:
    """`texts` as the metrics tokenise them (coco-caption's PTB tokenizer: lower case, punctuation dropped), so
    that agreement and the oracle compare what CIDEr-D scores.

    Args:
        texts: Captions.
    """
    from itune_hf.metrics import tokenize_captions

    return tokenize_captions(list(texts))


def agreement(candidates: Sequence[str], others: Sequence[str], document_frequency) -> np.ndarray:
    """`(len(candidates), len(others))`: the CIDEr-D of each candidate against each other caption alone, with fixed
    document frequencies (a single pair's own would make every weight zero).

    Args:
        candidates: Captions to choose from.
        others: Captions to agree with.
        document_frequency: `itune_hf.metrics.cider.DocumentFrequency`, e.g. of the training references.
    """
    from itune_hf.metrics.cider import cider_d_scores

    mine, theirs = tokens(candidates), tokens(others)
    hypotheses = [c for c in mine for _ in theirs]
    references = [[o] for _ in mine for o in theirs]
    _, scores = cider_d_scores(hypotheses, references, document_frequency=document_frequency)
    return scores.reshape(len(candidates), len(others))


def mbr_choice(candidates: Sequence[str], document_frequency) -> str:
    """The candidate with the highest mean agreement with the other candidates (the first of equals; a lone
    candidate is its own choice).

    Args:
        candidates: One image's n-best list, best first.
        document_frequency: Fixed document frequencies.
    """
    if len(candidates) < 2:
        return candidates[0]
    table = agreement(candidates, candidates, document_frequency)
    np.fill_diagonal(table, 0.0)
    return candidates[int(np.argmax(table.sum(axis=1)))]


def consensus_choice(candidates: Sequence[str], neighbour_captions: Sequence[str], document_frequency) -> str:
    """The candidate with the highest mean agreement with `neighbour_captions` (the first of equals).

    Args:
        candidates: One image's n-best list, best first.
        neighbour_captions: The captions of its most similar training images.
        document_frequency: Fixed document frequencies.
    """
    table = agreement(candidates, neighbour_captions, document_frequency)
    return candidates[int(np.argmax(table.mean(axis=1)))]


def oracle_choices(nbest: Mapping[str, Sequence[str]], references: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """Each image's candidate with the best CIDEr-D against its own references, with the document frequencies of
    all the images' references (as the corpus score computes them): rank k of every list is scored as one corpus.

    Args:
        nbest: Image id -> its n-best list.
        references: Image id -> its references.
    """
    from itune_hf.metrics.cider import cider_d_scores

    ids = list(nbest)
    depth = max(len(nbest[i]) for i in ids)
    refs = [tokens(references[i]) for i in ids]
    per_rank = np.stack([
        cider_d_scores(tokens([nbest[i][min(k, len(nbest[i]) - 1)] for i in ids]), refs)[1] for k in range(depth)
    ])  # fmt: skip
    best = per_rank.argmax(axis=0)
    return {i: nbest[i][min(int(k), len(nbest[i]) - 1)] for i, k in zip(ids, best)}


def nearest_training_images(cache, train_ids: Sequence[str], image_ids: Sequence[str], depth: int) -> dict:
    """Image id -> its `depth` most similar training images, most similar first (pooled tower states, cosine).

    Args:
        cache: The feature cache holding the training images and `image_ids`.
        train_ids: The training images.
        image_ids: The images.
        depth: Training images per image.
    """
    from itune_hf.vision.retrieval import pooled_features

    train_ids = list(train_ids)
    similarity = pooled_features(cache, image_ids) @ pooled_features(cache, train_ids).T
    nearest = similarity.topk(depth, dim=1).indices.tolist()
    return {i: [train_ids[j] for j in row] for i, row in zip(image_ids, nearest)}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="A trained captioner's directory (itune train's output).")
    parser.add_argument("--data", required=True, help="Its dataset.json (with a train split).")
    parser.add_argument("--split", default="val")
    parser.add_argument("--feature-cache", required=True, help="The feature cache of every image of --data.")
    parser.add_argument("--num-beams", type=int, default=8, help="Beam width; the whole beam is kept.")
    parser.add_argument("--neighbours", default="1,3,10", help="Comma-separated K of the consensus rows.")
    parser.add_argument("--max-new-tokens", type=int, default=25)
    parser.add_argument("--max-images", type=int, default=None)
    parser.add_argument("--json", default=None, help="Write the report here too.")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict:
    from itune_hf.data import load_captions
    from itune_hf.data.scenes import scenes_of_data
    from itune_hf.evaluation import generate_captions, score
    from itune_hf.metrics import scene_metrics_for
    from itune_hf.metrics.cider import DocumentFrequency
    from itune_hf.models.loading import load_captioner
    from itune_hf.vision.feature_cache import FeatureCache
    from itune_hf.vision.retrieval import nearest_neighbour_captions

    args = parse_args(argv)
    splits, scenes = load_captions(args.data), scenes_of_data(args.data)
    rows = splits[args.split]
    if args.max_images:
        rows = rows.select(range(min(args.max_images, len(rows))))
    train = dict(zip(splits["train"]["image_id"], map(list, splits["train"]["captions"])))
    references = dict(zip(rows["image_id"], map(list, rows["captions"])))
    cache = FeatureCache(args.feature_cache)
    model, processor = load_captioner(args.model)
    start = time.perf_counter()
    nbest = generate_captions(
        model, processor, rows, num_beams=args.num_beams, num_return_sequences=args.num_beams,
        max_new_tokens=args.max_new_tokens, feature_cache=cache, progress=False,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    frequency = DocumentFrequency.from_references([tokens(refs) for refs in train.values()])
    ids = list(nbest)
    choices = {
        "beam_best": {i: nbest[i][0] for i in ids},
        "oracle": oracle_choices(nbest, references),
        "mbr": {i: mbr_choice(nbest[i], frequency) for i in ids},
    }
    depths = [int(k) for k in args.neighbours.split(",")]
    nearest = nearest_training_images(cache, list(train), ids, max(depths))  # the states read once for every K
    for k in depths:
        neighbours = {i: [c for j in nearest[i][:k] for c in train[j]] for i in ids}
        choices[f"consensus_k{k}"] = {i: consensus_choice(nbest[i], neighbours[i], frequency) for i in ids}
    choices["retrieval"] = nearest_neighbour_captions(cache, train, ids)
    metrics = ["CIDEr", *scene_metrics_for(scenes)]
    report = {
        "model": args.model, "data": args.data, "split": args.split, "images": len(ids),
        "num_beams": args.num_beams, "generation_seconds": round(seconds, 1),
        "distinct_candidates_per_image": round(float(np.mean([len(set(tokens(nbest[i]))) for i in ids])), 2),
        "rows": {},
    }  # fmt: skip
    for name, captions in choices.items():
        scores = score(captions, rows, metrics=metrics, scenes=scenes)
        report["rows"][name] = {k: round(v, 4) for k, v in scores.items() if k in ("CIDEr", "Words_F1", "Object_F1")}
        report["rows"][name]["same_as_beam_best"] = sum(captions[i] == nbest[i][0] for i in ids)
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(report, file, indent=1)
    return report


if __name__ == "__main__":
    main()

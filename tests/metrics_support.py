"""The reference for the metrics tests: pycocoevalcap 1.2 (Java tokenizer and scorers), when it can run here."""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Hashable, Mapping, Sequence

import pytest


def coco_unavailable_reason() -> str | None:
    """Why pycocoevalcap's Java pipeline cannot run here, or None."""
    if importlib.util.find_spec("pycocoevalcap") is None:
        return "pycocoevalcap is not installed (pip install pycocoevalcap==1.2)"
    if shutil.which("java") is None:
        return "no Java on PATH (pycocoevalcap's PTB tokenizer is a Java program)"
    spec = importlib.util.find_spec("pycocoevalcap.tokenizer")
    directory = list(spec.submodule_search_locations)[0]
    if not os.access(directory, os.W_OK):
        return f"pycocoevalcap's tokenizer writes its input next to itself and {directory} is not writable"
    return None


requires_coco = pytest.mark.skipif(
    coco_unavailable_reason() is not None, reason=f"reference unavailable: {coco_unavailable_reason()}"
)


def coco_tokenize(captions_for_image: Mapping[Hashable, Sequence[str]]) -> dict[Hashable, list[str]]:
    """pycocoevalcap's PTBTokenizer on image id -> captions (one Java call, in the mapping's order)."""
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    return PTBTokenizer().tokenize({k: [{"caption": c} for c in caps] for k, caps in captions_for_image.items()})


def coco_tokenize_list(captions: Sequence[str]) -> list[str]:
    """pycocoevalcap's PTBTokenizer on a list of captions (one Java call, in order)."""
    tokenized = coco_tokenize({index: [caption] for index, caption in enumerate(captions)})
    return [tokenized[index][0] for index in range(len(captions))]


def coco_scores(
    predictions: Mapping[Hashable, str], references: Mapping[Hashable, Sequence[str]], *, tokenize: bool = True
) -> tuple[dict[str, float], dict[str, list[float]]]:
    """coco-caption's BLEU, ROUGE-L and CIDEr (corpus and per image), as COCOEvalCap computes them.

    Args:
        predictions: Image id -> caption.
        references: Image id -> captions (the order of this mapping is the evaluation order).
        tokenize: Run pycocoevalcap's PTBTokenizer first (else the captions are already tokenised).
    """
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge

    ids = list(references)
    if tokenize:
        gts = coco_tokenize({k: list(references[k]) for k in ids})
        res = coco_tokenize({k: [predictions[k]] for k in ids})
    else:
        gts = {k: list(references[k]) for k in ids}
        res = {k: [predictions[k]] for k in ids}
    scores: dict[str, float] = {}
    per_image: dict[str, list[float]] = {}
    bleu, bleu_images = Bleu(4).compute_score(gts, res, verbose=0)
    for k in range(4):
        scores[f"Bleu_{k + 1}"] = bleu[k]
        per_image[f"Bleu_{k + 1}"] = list(bleu_images[k])
    scores["ROUGE_L"], rouge_images = Rouge().compute_score(gts, res)
    per_image["ROUGE_L"] = list(rouge_images)
    scores["CIDEr"], cider_images = Cider().compute_score(gts, res)
    per_image["CIDEr"] = list(cider_images)
    return {k: float(v) for k, v in scores.items()}, per_image

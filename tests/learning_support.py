"""The bar every "it learns" test sets: a captioner must do clearly better than one that ignores its image.

Two image-blind controls, both computed on the test's own data (never typed in):

* the best constant caption (`itune_hf.evaluation.constant_caption_floor`): of the most frequent training captions,
  the one with the best object F1 on the training split, written for every test image;
* the shuffled-image control (`itune eval --shuffled-control`): the captioner's own captions scored against other
  images' references and scenes. A captioner that ignores its image loses nothing there.

`assert_learned_from_the_images` asks for the grounded metric (object F1, read against the recorded scenes) at least
`factor` times the constant caption's and `margin` above the shuffled control, and CIDEr-D above the constant
caption's. A constant captioner fails the first and the second; one that copies another image's caption fails the
second (`tests/metrics/test_scene_controls.py` checks both).
"""

from __future__ import annotations

from typing import Any

from itune_hf.data import load_captions
from itune_hf.data.scenes import read_scenes
from itune_hf.evaluation import constant_caption_floor

#: The default bar: object F1 at least twice the constant caption's and 0.2 above shuffled images.
FACTOR, MARGIN = 2.0, 0.2


def blind_floor(dataset_json, split: str = "test", candidates: int = 300, first: int | None = None) -> dict[str, Any]:
    """The best constant caption of a generated world and its scores on `split` (`constant_caption_floor`).

    Args:
        dataset_json: A generated world's `dataset.json` (it records the scenes).
        split: The split the captioner is scored on.
        candidates: How many of the most frequent training captions are tried.
        first: Score on the first `first` images of the split only (what `itune demo --test-images` captions).
    """
    splits, scenes = load_captions(str(dataset_json)), read_scenes(dataset_json)
    refs = {name: dict(zip(splits[name]["image_id"], map(list, splits[name]["captions"]))) for name in ("train", split)}
    scored = dict(list(refs[split].items())[:first])
    return constant_caption_floor(refs["train"], scored, scenes=scenes, candidates=candidates)


def learning_failures(
    scores: dict[str, Any], floor: dict[str, Any], *, factor: float = FACTOR, margin: float = MARGIN
) -> list[str]:
    """What a captioner's scores miss of the bar (empty: it passes).

    Args:
        scores: `itune eval`'s scores with `--metrics CIDEr,Objects --shuffled-control` (`Object_F1`,
            `"Object_F1 (shuffled)"`, `CIDEr`).
        floor: `blind_floor`'s result.
        factor: Object F1 must be at least this times the constant caption's.
        margin: Object F1 must exceed the shuffled control's by this much.
    """
    f1, shuffled = scores["Object_F1"], scores["Object_F1 (shuffled)"]
    constant_f1 = floor["object_caption_scores"]["Object_F1"]
    failures = []
    if f1 < factor * constant_f1:
        failures.append(f"object F1 {f1:.3f} < {factor} x the constant caption's {constant_f1:.3f}")
    if f1 - shuffled < margin:
        failures.append(f"object F1 {f1:.3f} is not {margin} above shuffled images' {shuffled:.3f}")
    if scores["CIDEr"] <= floor["CIDEr"]:
        failures.append(f"CIDEr {scores['CIDEr']:.3f} <= the constant caption's {floor['CIDEr']:.3f}")
    return failures


def assert_learned_from_the_images(scores: dict[str, Any], floor: dict[str, Any], **bar: float) -> None:
    """Fail, naming each miss and the constant caption, unless the captioner clears the bar (`learning_failures`)."""
    failures = learning_failures(scores, floor, **bar)
    assert not failures, f"{'; '.join(failures)} (constant caption {floor['object_caption']!r})"

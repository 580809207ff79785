"""Where a clip-art caption's score comes from: its title part against its category part, per captioner.

An `itune make-clipart` caption is "<title>, <category phrase>.", "A <category phrase>." or a title or description
alone ("<title>."); the phrases are those of the image's folder and of its duplicates' folders. This study splits each
predicted caption the same way and reports, per captioner (an `itune eval` results file, or the nearest-neighbour
retrieval baseline over a feature cache):

- the share of images whose caption names one of the image's category phrases (`category_named_right`);
- the share whose caption's title shares a lower-cased word with a reference's title, function words ("of",
  "the") not counted (`title_word_shared`);
- how many captions are a category alone ("A mammal."), and the most frequent captions;
- CIDEr-D of the title part alone and of the category part alone (each as "<part>.", a caption without that part
  scored as the empty caption), against the full references;
- mean words per caption and distinct captions.

    python benchmarks/study_caption_parts.py --data outputs/clipart/dataset.json --split val \\
        --retrieval-cache outputs/cache-lite0 MODEL=RUN/eval-val/results.json ...

Prints one JSON object: captioner name -> its report (`retrieval` first when `--retrieval-cache` is given).
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from collections.abc import Collection, Hashable, Mapping, Sequence

WORD = re.compile(r"[a-z0-9']+")


def caption_parts(caption: str, phrases: Collection[str]) -> tuple[str | None, str | None]:
    """A caption's title and category phrase, lower-cased, the final period dropped; None for a part it lacks.

    "<title>, <phrase>." has both; "A <phrase>." only the category; any other caption ("<title>.", a description
    sentence, a title whose last comma is not followed by a category phrase) is all title.

    Args:
        caption: The caption.
        phrases: The corpus's category phrases (`category_phrases`).
    """
    text = caption.strip().rstrip(".").strip().lower()
    title, _, last = text.rpartition(",")
    if title and last.strip() in phrases:
        return title.strip(), last.strip()
    article, _, rest = text.partition(" ")
    if article in ("a", "an") and rest in phrases:
        return None, rest
    return text or None, None


def category_phrases(entries: Sequence[Mapping]) -> dict[str, set[str]]:
    """Image id -> the category phrases of its file's folder and of its duplicates' folders (the phrases
    `itune make-clipart` writes into its captions).

    Args:
        entries: The `images` of an `itune make-clipart` dataset.json.
    """
    from itune_hf.data._clipart_text import category_phrase

    phrases = {}
    for entry in entries:
        folders = [entry["category"], *(path.rpartition("/")[0] + "/" for path in entry.get("duplicates", []))]
        phrases[entry["image_id"]] = {p for p in map(category_phrase, folders) if p}
    return phrases


def title_words(title: str | None) -> set[str]:
    """The lower-cased words of a title, English function words ("of", "the") left out; none for no title."""
    from itune_hf.data._clipart_text import STOP_WORDS

    return set(WORD.findall(title or "")) - STOP_WORDS


def part_captions(captions: Mapping[Hashable, str], part: int, phrases: Collection[str]) -> dict[Hashable, str]:
    """Each caption cut to one part (0: title, 1: category), as a caption ("<part>."); "" where it lacks the part."""
    cut = {}
    for key, caption in captions.items():
        text = caption_parts(caption, phrases)[part]
        cut[key] = f"{text}." if text else ""
    return cut


def part_report(
    captions: Mapping[Hashable, str], references: Mapping[Hashable, Sequence[str]], categories: Mapping[Hashable, set]
) -> dict:
    """The measures the module docstring lists, for one captioner over the images it captioned.

    Args:
        captions: Image id -> predicted caption.
        references: Image id -> its reference captions (at least every captioned image).
        categories: Image id -> its category phrases (`category_phrases`; at least every captioned image).
    """
    from itune_hf.metrics import score_captions

    def cider(predicted: Mapping[Hashable, str]) -> float:
        return round(score_captions(dict(predicted), refs, metrics=["CIDEr"])["CIDEr"], 4)

    phrases = set().union(*categories.values())
    refs = {key: list(references[key]) for key in captions}
    named = shared = alone = 0
    for key, caption in captions.items():
        title, category = caption_parts(caption, phrases)
        reference_titles = [caption_parts(r, phrases)[0] for r in refs[key]]
        named += category in categories[key]
        shared += bool(title_words(title) & set().union(*map(title_words, reference_titles)))
        alone += title is None
    count = len(captions)
    return {
        "images": count,
        "category_named_right": round(named / count, 4),
        "title_word_shared": round(shared / count, 4),
        "category_only_captions": alone,
        "CIDEr": cider(captions),
        "CIDEr_title_part_only": cider(part_captions(captions, 0, phrases)),
        "CIDEr_category_part_only": cider(part_captions(captions, 1, phrases)),
        "mean_words": round(sum(len(c.split()) for c in captions.values()) / count, 2),
        "distinct_captions": len(set(captions.values())),
        "most_frequent": Counter(captions.values()).most_common(5),
    }


def retrieval_captions(entries: Sequence[Mapping], split: str, cache_dir: str) -> dict:
    """The nearest-neighbour baseline's caption of each image of `split`: its most similar training image's first
    reference, by the pooled states of the feature cache."""
    from itune_hf.vision.feature_cache import FeatureCache
    from itune_hf.vision.retrieval import nearest_neighbour_captions

    train = references_of(entries, "train")
    return nearest_neighbour_captions(FeatureCache(cache_dir), train, list(references_of(entries, split)))


def references_of(entries: Sequence[Mapping], split: str) -> dict[str, list[str]]:
    """Image id -> its reference captions, for the images of one split of a dataset.json."""
    return {e["image_id"]: [s["raw"] for s in e["sentences"]] for e in entries if e["split"] == split}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="*", metavar="NAME=RESULTS.json", help="itune eval's results.json files.")
    parser.add_argument("--data", required=True, help="The itune make-clipart dataset.json.")
    parser.add_argument("--split", default="val")
    parser.add_argument("--retrieval-cache", default=None, help="A feature cache: add the retrieval baseline's row.")
    args = parser.parse_args(argv)
    if not args.results and not args.retrieval_cache:
        parser.error("give at least one NAME=RESULTS.json or --retrieval-cache")
    return args


def main(argv: Sequence[str] | None = None) -> dict:
    from itune_hf.data.coco_results import read_coco_results

    args = parse_args(argv)
    with open(args.data, encoding="utf-8") as file:
        entries = json.load(file)["images"]
    references, categories = references_of(entries, args.split), category_phrases(entries)
    report = {}
    if args.retrieval_cache:
        captions = retrieval_captions(entries, args.split, args.retrieval_cache)
        report["retrieval"] = part_report(captions, references, categories)
    for item in args.results:
        name, path = item.split("=", 1)
        report[name] = part_report({str(k): c for k, c in read_coco_results(path).items()}, references, categories)
    print(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()

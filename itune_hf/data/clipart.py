"""A real human-captioned image corpus from Debian's `openclipart-svg` package (`itune make-clipart`).

Every SVG of the installed package (`/usr/share/openclipart/svg/<category>/...svg`, ~8,100 public-domain drawings)
is read for its `<dc:title>`, `<dc:description>`, `<rdf:li>` keywords, creator and folder path, rendered with
cairosvg at `image_size` pixels (the longest side) on white (a speck on a large page cropped to its drawing; the
pixels depend on the file alone: `itune_hf.data._clipart_render`), and written as a Karpathy `dataset.json` plus
`images/<category>/<name>.png`. Files are parsed with defusedxml (no entity declarations, nothing external; at most
`MAX_SVG_BYTES`); a file that cannot be parsed or rendered, or renders blank, is skipped and named (`skipped.json`,
one `ClipartSkippedWarning` each). Renders are cached per SVG content (`render_cache_dir`), so a rerun, or a run after
an interrupted one, renders only what is missing.

Each entry holds `sentences` (clean captions, Karpathy format), `alt_text` (the raw title, keywords and path words:
the noisy web-like arm, `--caption-column alt_text`), `content_words` (lower-case singular nouns of its title,
keywords and category, for grounding), and `source`, `title` (as the file has it), `clean_title`, `description`,
`keywords`, `category` and `duplicates`.

Cleaning, in order (each rule's count is in `generator.cleaning`; the code is `itune_hf.data._clipart_text`):

- **collection words** (`collection_words`): a title naming its picture beside collection words keeps the rest
  ("US Capitol Building Clipart Style" -> "US Capitol Building Style").
- **collection title** (`collection_title`, `missing_title`): a title that names the collection, theme or credit
  instead of the picture ("Part of the Flat Icon Collection (Wed Aug 25 23:29:46 2004)", "Lemon SVG theme",
  "Etiquette Icons", "AIGA_Symbol_Signs", "SVG Gradient Collection by Alan Horkan, 2004.", "R16 sibmission"), or none,
  is replaced by the file name (none when the file is named after the collection too).
- **credit prefix** (`credit_prefix`): "Clipart by <author> - <name>" keeps the name; a one-word or file-name name that
  differs from the file's own English name was a template copied across a series ("Clipart by Nicu Buculei -
  jigsaw_red_10" on jigsaw_green_03.svg), so the file name wins ("jigsaw green").
- **repeated title** (`repeated_title`): a title `REPEATED_TITLE_FILES` or more files carry ("gramastar", "Australian
  Maps") gives way to the file's own name where that is English and names a thing; else it stays ("card").
- **file-name title** (`file_name_title`): a file name, or a title written like one, becomes words: `_`, `-`, `#` and
  camelCase split, numbers and codes dropped ("BlueMan#204" -> "blue man", "arrow1" -> "arrow", "05c" dropped, a
  series' final letter code: "bullet_hole_linda_kim_ab" -> "bullet hole"),
  collection prefixes ("aiga", "gnome") and the creator's name dropped, its last word possibly cut short
  ("sand_glass_frederic_mose_01" -> "sand glass").
- **author name** (`author_name`): a title holding its creator's name loses it ("Saturn by Dan Gerhards" -> "Saturn").
- **black and white** (`black_and_white`): "(B and W)", "B_W" read "in black and white", after the name.
- **trailing number** (`trailing_number`): "Capsized Sailing Illustration 6" -> "Capsized Sailing Illustration" (a
  range such as "1959-1963" stays).
- **non-English title** (`non_english_title`): a title less than half of whose words are English words stays in the
  alt-text and the `title` field but makes no caption. The English words are built from the corpus itself: its folder
  names, every keyword, the words two or more creators use, a stop-word list, and the title words of the creators at
  least half of whose title words are already English (and at most 5% of whose titles hold an Italian, French,
  Spanish, Portuguese or German function word such as "di", "de", "und"); those function words are never English.
  Limits: an English word the corpus uses once, by a creator of few files or of mostly foreign or coded titles, counts
  as foreign ("Page", "Fondue", program names like "konqueror"); a foreign word in a keyword or in the titles of an
  English-writing creator counts as English ("Chateau"); place names count as foreign unless the corpus uses them as
  a folder or keyword (some flags).
- **description** (`description_not_a_caption`): links, e-mail addresses, credits ("EPS converted from", "Part of ...
  Collection"), the drawing program ("Made with Sodipodi") and Perl references printed as text ("HASH(0x8699fd4)")
  are removed; the first sentence is a caption when it is English, 2 to 30 words long, not the title again, not a
  collection title repeated, and not a description `REPEATED_DESCRIPTION_FILES` or more files share (a series'
  blurb). Every text first has HTML entities decoded, Windows-1252 letters read as Latin-1 repaired and control
  characters removed.
- **captions**: "<title>, <category>." from the clean English title and the category phrase (the deepest folder that
  names a kind of thing, singular: "Strawberry, fruit.", "Contour cheetah, big cat."; left out when the title says
  it), and the description's sentence; an image held in several folders has every copy's. Nothing else is added.
  With neither, a folder below the top level still makes "A <category>." (`category_caption`: "A bird." for Italian
  "Cigno" in animals/birds/); the top-level folders name domains (computer/, office/), not what is drawn. With no
  caption at all the image is dropped (`no_caption`, `no_caption_dropped`).
- **content words**: the singular nouns (folder words, keyword words two or more creators use, and title words the
  file's own keywords repeat; less stop words, generic words such as "icon", "clipart", "mapsym", adjectives and the
  authors' names) of the English title, the keywords (those naming a theme dropped) and the folders below the top
  level (the top-level folders' words count only where the title says them). No part-of-speech tagger: a few verbs
  and adjectives pass.
- **identical pixels** (`duplicate_pixels_merged`): files that render to the same pixels (the package holds the same
  drawing in several folders) are one image, under its first path; its other files are its `duplicates`.

Splits: images are grouped so that near-duplicates stay together: identical pixels (one image already), near-identical
pixels (`_clipart_render.near_identical_pairs`), the same normalised title (its words without numbers or file-name
suffixes), one series in one folder (the file name with its numbers or final letter code blanked: "arrow08_2.svg" and
"arrow08_4.svg"), and the same caption ("A flag."). A
group's split is fixed by the SHA-256 of its first file's path against `split_fractions`. A group larger than
`max_group_share` of its split (at least one image) keeps that many images, those whose paths hash lowest; the rest
are dropped and counted (`group_cap_dropped`, listed in `skipped.json`; the ~1,375 procedurally generated "gramastar"
stars are one such group).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import shutil
import subprocess
import warnings
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..utils.files import atomic_write_json
from ._clipart_render import (  # (the rendering names are this module's too, as before it had its own file)
    MAX_SVG_BYTES,
    RENDER_VERSION,
    near_identical_pairs,
    pixel_hash,
    read_svg,
    reason_of,
    render_all,
    render_cache_dir,
    render_cached,
    render_svg,
)
from ._clipart_text import (
    CleanText,
    SvgRecord,
    build_vocabulary,
    clean_record,
    folder_words,
    normalised_title,
    singular,
)
from ._common import DataError
from ._output import DATASET_FILE, write_dataset_dir

DATASET_KIND = "itune-clipart"
#: The dataset's version: raised whenever a cleaning rule changes what dataset.json holds (2: every word of an
#: English title but stop, generic and adjective words is a content word, not only those its keywords repeat;
#: 3: each entry names its near-duplicate group, `group`, so that retrieval and re-splits can keep groups apart;
#: 4: renders that do not depend on the process's earlier renders, small drawings cropped, near-identical drawings
#: and letter-coded series grouped, codes, collection words, mis-decoded letters and Perl references cleaned).
CLIPART_VERSION = 4
PACKAGE = "openclipart-svg"
#: Where Debian installs the package's SVGs (used when `dpkg -L` is not available).
DEFAULT_SVG_ROOT = Path("/usr/share/openclipart/svg")
DEFAULT_IMAGE_SIZE = 160
MIN_IMAGE_SIZE, MAX_IMAGE_SIZE = 16, 2048
#: The split targets (train, val, test images): the default fractions are their shares.
SPLIT_TARGETS = {"train": 5000, "val": 500, "test": 1000}
DEFAULT_SPLIT_FRACTIONS = (10 / 13, 1 / 13, 2 / 13)
DEFAULT_MAX_GROUP_SHARE = 0.01
SKIPPED_FILE = "skipped.json"
INSTALL_HINT = f"apt-get install {PACKAGE}"


class ClipartSkippedWarning(UserWarning):
    """An SVG file of the corpus was skipped: it cannot be parsed or rendered, or renders blank."""


@dataclass
class _Image:
    """One image of the dataset: the files that render to its pixels, with their clean text."""

    png: Path
    pixels: str
    copies: list[tuple[SvgRecord, CleanText]] = field(default_factory=list)

    @property
    def source(self) -> str:
        return self.copies[0][0].source

    @property
    def sentences(self) -> list[str]:
        return list(dict.fromkeys(sentence for _, clean in self.copies for sentence in clean.sentences))

    def group_keys(self) -> set[str]:
        """The keys that tie it to near-duplicates (see the module docstring)."""
        keys = {f"pixels:{self.pixels}"}
        for record, clean in self.copies:
            if normalised_title(clean.title):
                keys.add(f"title:{normalised_title(clean.title)}")
            if re.search(r"\d|_[a-z]{1,2}$", record.stem):  # "arrow08_2", "bullet_hole_linda_kim_ab"
                keys.add(f"series:{record.category}{re.sub(r'[0-9]+|(?<=_)[a-z]{1,2}$', '#', record.stem)}")
            keys.update(f"caption:{' '.join(_tokens(sentence))}" for sentence in clean.sentences)
        return keys


def locate_openclipart() -> tuple[Path, str]:
    """The installed package's SVG root and version (`dpkg`; the standard path where `dpkg` is missing).

    Raises:
        DataError: the package is not installed (naming `apt-get install openclipart-svg`).
    """
    listing = _dpkg(["dpkg", "-L", PACKAGE])
    roots = [Path(line) for line in (listing or "").splitlines() if line.rstrip("/").endswith("openclipart/svg")]
    root = roots[0] if roots else DEFAULT_SVG_ROOT
    if not root.is_dir():
        raise DataError(f"the {PACKAGE} package is not installed (no {root}): {INSTALL_HINT}")
    version = _dpkg(["dpkg-query", "-W", "-f=${Version}", PACKAGE])
    return root, (version or "unknown version").strip()


def _dpkg(command: list[str]) -> str | None:
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout if result.returncode == 0 else None


def parse_metadata(data: bytes, source: str) -> SvgRecord:
    """What an SVG says about itself: the `cc:Work`'s title, description, keywords and creator.

    Parsed with defusedxml: a DTD's entity declarations and external references are refused.

    Args:
        data: The file's bytes.
        source: Its path relative to the SVG root.

    Raises:
        ValueError: not well-formed XML, or it declares entities (defusedxml's errors are `ValueError`s or
            `ParseError`s, both caught by the caller).
    """
    from defusedxml import ElementTree

    root = ElementTree.fromstring(data, forbid_dtd=False, forbid_entities=True, forbid_external=True)
    work = root.find(".//{*}Work")

    def text(path: str) -> str:
        found = work.find(path) if work is not None else None
        return (found.text or "").strip() if found is not None else ""

    keywords = [] if work is None else [(item.text or "").strip() for item in work.iterfind("{*}subject//{*}li")]
    return SvgRecord(
        source=source,
        title=text("{*}title") or (root.findtext("{http://www.w3.org/2000/svg}title") or "").strip(),
        description=text("{*}description"),
        keywords=tuple(keyword for keyword in keywords if keyword),
        creator=text("{*}creator//{*}title"),
    )


def read_corpus(svg_root: Path) -> tuple[list[SvgRecord], list[dict[str, str]]]:
    """Every SVG under `svg_root` (sorted by path) as a record, and the files skipped with their reason.

    Args:
        svg_root: The package's SVG folder (or any tree of SVG files).
    """
    records, skipped = [], []
    for path in sorted(svg_root.rglob("*.svg")):
        source = path.relative_to(svg_root).as_posix()
        try:
            records.append(parse_metadata(read_svg(path), source))
        except Exception as error:  # noqa: BLE001 - any parse failure skips the file, named
            skipped.append({"source": source, "stage": "parse", "reason": reason_of(error)})
    return records, skipped


def merge_identical(cleaned: Iterable[tuple[SvgRecord, CleanText, Path, str]], counts: Counter) -> list[_Image]:
    """One `_Image` per distinct pixel hash, its copies in path order (`duplicate_pixels_merged` counts the rest).

    Args:
        cleaned: `(record, clean text, png, pixel hash)` per rendered file, in path order.
        counts: The cleaning counts, updated.
    """
    images: dict[str, _Image] = {}
    for record, clean, png, pixels in cleaned:
        if pixels in images:
            counts["duplicate_pixels_merged"] += 1
        images.setdefault(pixels, _Image(png=png, pixels=pixels)).copies.append((record, clean))
    return list(images.values())


def group_images(images: Sequence[_Image]) -> list[list[_Image]]:
    """The images in groups of near-duplicates: connected by any shared `group_keys` or near-identical pixels
    (`near_identical_pairs`; union-find), each group in path order, groups in the order of their first path."""
    parent = list(range(len(images)))

    def find(index: int) -> int:
        while parent[index] != index:
            parent[index] = parent[parent[index]]
            index = parent[index]
        return index

    first: dict[str, int] = {}
    for index, image in enumerate(images):
        for key in sorted(image.group_keys()):
            parent[find(index)] = find(first.setdefault(key, index))
    for index, other in near_identical_pairs([image.png for image in images]):
        parent[find(other)] = find(index)
    groups: dict[int, list[_Image]] = {}
    for index, image in enumerate(images):
        groups.setdefault(find(index), []).append(image)
    ordered = [sorted(group, key=lambda image: image.source) for group in groups.values()]
    return sorted(ordered, key=lambda group: group[0].source)


def stable_unit(text: str) -> float:
    """A number in [0, 1) fixed by `text` (its SHA-256; the same on every machine and Python)."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big") / 2**64


def split_of(key: str, fractions: Sequence[float]) -> str:
    """The split (`train`, `val`, `test`) of the group whose key is `key`, by `stable_unit` against `fractions`."""
    value, bound = stable_unit(key), 0.0
    for name, fraction in zip(("train", "val", "test"), fractions):
        bound += fraction
        if value < bound:
            return name
    return "test"


def cap_groups(groups: dict[str, list[list[_Image]]], max_share: float) -> tuple[dict[str, list[_Image]], list[_Image]]:
    """Each split's images with no group above `max_share` of the split's final size (at least one image): the
    largest cap that holds once the capped groups have shrunk the split (iterated to its fixed point). A capped
    group keeps the images whose path hashes lowest.

    Args:
        groups: Per split, its groups.
        max_share: The largest share of its split a group may have.

    Returns:
        Per split, the kept images (path order); and the dropped images.
    """
    kept: dict[str, list[_Image]] = {}
    dropped: list[_Image] = []
    for name, split_groups in groups.items():
        cap = max(1, math.floor(max_share * sum(map(len, split_groups))))
        while True:
            size = sum(min(len(group), cap) for group in split_groups)
            smaller = max(1, math.floor(max_share * size))
            if smaller == cap:
                break
            cap = smaller
        kept[name] = []
        for group in split_groups:
            ranked = sorted(group, key=lambda image: hashlib.sha256(image.source.encode()).hexdigest())
            kept[name].extend(ranked[:cap])
            dropped.extend(ranked[cap:])
        kept[name].sort(key=lambda image: image.source)
    return kept, dropped


def _tokens(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+(?:'[a-z]+)?", text.lower())


def _karpathy_entry(image: _Image, index: int, split: str, sentence_id: int, group: str) -> dict[str, Any]:
    """The `dataset.json` entry of an image (its sentences numbered from `sentence_id`; `group`: the first file of its
    near-duplicate group)."""
    record, clean = image.copies[0]
    sentences = [
        {"raw": raw, "tokens": _tokens(raw), "imgid": index, "sentid": sentence_id + number}
        for number, raw in enumerate(image.sentences)
    ]
    words = [word for _, copy in image.copies for word in copy.content_words]
    folder, _, _ = record.source.rpartition("/")
    return {
        "filepath": f"images/{folder}".rstrip("/"),
        "filename": f"{record.stem}.png",
        "imgid": index,
        "image_id": record.source.removesuffix(".svg"),
        "split": split,
        "sentids": [sentence["sentid"] for sentence in sentences],
        "sentences": sentences,
        "alt_text": clean.alt_text,
        "content_words": list(dict.fromkeys(words)),
        "source": record.source,
        "title": record.title,
        "clean_title": clean.title,
        "description": record.description,
        "keywords": list(record.keywords),
        "category": record.category,
        "duplicates": [copy.source for copy, _ in image.copies[1:]],
        "group": group,
    }


def make_clipart(
    output_dir: str | os.PathLike,
    *,
    image_size: int = DEFAULT_IMAGE_SIZE,
    overwrite: bool = False,
    svg_root: str | os.PathLike | None = None,
    cache_dir: str | os.PathLike | None = None,
    workers: int | None = None,
    split_fractions: tuple[float, float, float] = DEFAULT_SPLIT_FRACTIONS,
    max_group_share: float = DEFAULT_MAX_GROUP_SHARE,
) -> Path:
    """Write the clip-art corpus as a Karpathy-format dataset; returns the path of its `dataset.json`.

    Layout: `<output_dir>/dataset.json`, `<output_dir>/images/<category>/<name>.png` and `<output_dir>/skipped.json`
    (the files skipped with their reason, and the images dropped for having no caption or by the group cap). Every
    skipped file also warns `ClipartSkippedWarning`. The cleaning rules and the split rule are in this module's
    docstring and docs/data.md.

    Args:
        output_dir: Directory to write (created). A non-empty directory is refused unless it is a previous
            `make-clipart` output (replaced) or `overwrite` is set.
        image_size: The longest side of each image in pixels, `MIN_IMAGE_SIZE` to `MAX_IMAGE_SIZE` (the other side
            keeps the drawing's proportions).
        overwrite: Write into a non-empty directory that is not a previous output (same-named files replaced).
        svg_root: A tree of SVG files to read instead of the installed `openclipart-svg` package.
        cache_dir: The render cache's root (default: `<data cache>/clipart-renders`); a rerun, or a run after an
            interrupted one, renders only what it does not hold.
        workers: Rendering processes (default: the CPUs, at most 8; 1 renders in this process).
        split_fractions: The shares of train, val and test (default: those of 5,000 / 500 / 1,000).
        max_group_share: The largest share of its split one group of near-duplicates may hold (0.01).

    Raises:
        ValueError: an argument is out of range.
        DataError: the package or cairosvg is not installed, no file yields an image, or the output directory is
            refused.
    """
    _check_arguments(image_size, split_fractions, max_group_share)
    root, package = (Path(svg_root), f"SVG tree {svg_root}") if svg_root is not None else _installed_package()
    _require_cairosvg()
    images, skipped, counts = _collect(root, render_cache_dir(cache_dir, image_size), image_size, _workers(workers))
    for entry in skipped:
        warnings.warn(ClipartSkippedWarning(f"{entry['source']} skipped: {entry['reason']}"), stacklevel=2)
    captioned = [image for image in images if image.sentences]
    counts["no_caption_dropped"] = len(images) - len(captioned)
    groups: dict[str, list[list[_Image]]] = {"train": [], "val": [], "test": []}
    for group in group_images(captioned):
        groups[split_of(group[0].source, split_fractions)].append(group)
    kept, dropped = cap_groups(groups, max_group_share)
    counts["group_cap_dropped"] = len(dropped)
    group_of = {image.source: group[0].source for split in groups.values() for group in split for image in group}
    if not captioned:
        raise DataError(f"{root}: no SVG file gave a captioned image ({len(images)} images, {len(skipped)} skipped)")
    generator = {
        "name": "itune_hf.data.clipart", "version": CLIPART_VERSION, "package": package, "image_size": image_size,
        "split_fractions": list(split_fractions), "max_group_share": max_group_share,
        "split_sizes": {name: len(kept[name]) for name in kept}, "split_targets": SPLIT_TARGETS,
        "cleaning": dict(sorted(counts.items())),
    }  # fmt: skip
    report = {
        "skipped": skipped,
        "no_caption": sorted(image.source for image in images if not image.sentences),
        "group_cap": sorted(image.source for image in dropped),
    }
    return write_dataset_dir(
        output_dir,
        kind=DATASET_KIND,
        command="itune make-clipart",
        overwrite=overwrite,
        build=lambda directory: _build(directory, kept, group_of, generator, report),
    )


def _collect(root: Path, cache: Path, size: int, workers: int) -> tuple[list[_Image], list[dict[str, str]], Counter]:
    """Read, render (through `cache`), clean and merge the corpus: its images, the skipped files and the counts."""
    records, skipped = read_corpus(root)
    rendered = render_all(root, [record.source for record in records], cache, size, workers)
    counts: Counter = Counter(parse_failed=len(skipped))
    cleaned = _clean_rendered(records, rendered, skipped, counts)
    return merge_identical(cleaned, counts), skipped, counts


def _check_arguments(image_size: int, split_fractions: Sequence[float], max_group_share: float) -> None:
    if not MIN_IMAGE_SIZE <= image_size <= MAX_IMAGE_SIZE:
        raise ValueError(f"image_size must be from {MIN_IMAGE_SIZE} to {MAX_IMAGE_SIZE} pixels; got {image_size}")
    if len(split_fractions) != 3 or min(split_fractions) < 0 or abs(sum(split_fractions) - 1) > 1e-6:
        raise ValueError(f"split_fractions must be three non-negative shares summing to 1; got {split_fractions}")
    if not 0 < max_group_share <= 1:
        raise ValueError(f"max_group_share must be in (0, 1]; got {max_group_share}")


def _require_cairosvg() -> None:
    try:
        import cairosvg  # noqa: F401
    except ImportError:
        raise DataError("cairosvg is not installed (it renders the SVGs): pip install '.[real]'") from None
    except OSError as error:  # cairocffi without the system's libcairo
        raise DataError(f"cairosvg cannot load libcairo ({error}): apt-get install libcairo2") from None


def _installed_package() -> tuple[Path, str]:
    root, version = locate_openclipart()
    return root, f"{PACKAGE} {version}"


def _workers(workers: int | None) -> int:
    return workers if workers is not None else max(1, min(8, os.cpu_count() or 1))


def _clean_rendered(
    records: Sequence[SvgRecord],
    rendered: Sequence[tuple[Path | None, str]],
    skipped: list[dict[str, str]],
    counts: Counter,
) -> list[tuple[SvgRecord, CleanText, Path, str]]:
    """Each rendered record with its clean text, png and pixel hash; those that did not render join `skipped`."""
    vocabulary = build_vocabulary(records)
    domains = _domains(records)
    cleaned = []
    for record, (png, detail) in zip(records, rendered):
        if png is None:
            skipped.append({"source": record.source, "stage": "render", "reason": detail})
            counts["render_failed"] += 1
            continue
        clean = clean_record(record, vocabulary, domains)
        counts.update(set(clean.rules))
        cleaned.append((record, clean, png, detail))
    return cleaned


def _domains(records: Iterable[SvgRecord]) -> frozenset[str]:
    """The singular words of the top-level folders (`computer`, `office`, `recreation`, ...)."""
    return frozenset(singular(word) for record in records for word in folder_words(record.category.split("/")[0]))


def _build(
    directory: Path,
    kept: dict[str, list[_Image]],
    group_of: dict[str, str],
    generator: dict[str, Any],
    report: dict[str, Any],
) -> None:
    """Copy the images into `directory/images/` and write `dataset.json` and `skipped.json` (`group_of`: each image's
    near-duplicate group, named by its first file)."""
    entries: list[dict[str, Any]] = []
    sentence_id = 0
    for split in ("train", "val", "test"):
        for image in kept[split]:
            entry = _karpathy_entry(image, len(entries), split, sentence_id, group_of[image.source])
            sentence_id += len(entry["sentences"])
            target = directory / entry["filepath"] / entry["filename"]
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(image.png, target)
            entries.append(entry)
    atomic_write_json(directory / SKIPPED_FILE, report, indent=1)
    data = {"dataset": DATASET_KIND, "generator": generator, "images": entries}
    atomic_write_json(directory / DATASET_FILE, data, indent=None)


__all__ = [
    "CLIPART_VERSION", "ClipartSkippedWarning", "MAX_SVG_BYTES", "RENDER_VERSION", "locate_openclipart",
    "make_clipart", "merge_identical", "group_images", "parse_metadata", "pixel_hash", "read_corpus", "read_svg",
    "render_all", "render_cache_dir", "render_cached", "render_svg", "split_of", "stable_unit",
]  # fmt: skip

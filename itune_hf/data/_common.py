"""Shared pieces of the loaders: errors, warnings, the image report, split names, the common columns.

Every loader returns rows with the same columns (`CAPTION_COLUMNS`): `image_id` (str), `image_path` (absolute str;
empty when the image is embedded in an `image` column instead), `captions` (list of raw sentences) and `split`.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

OnMissing = Literal["report", "error", "keep"]
#: `--on-missing`'s choices; a loader also takes `"keep"`: rows are kept whatever their image files (scoring reads
#: captions only).
ON_MISSING_CHOICES: tuple[str, ...] = ("report", "error")
ON_MISSING_VALUES: tuple[str, ...] = (*ON_MISSING_CHOICES, "keep")

#: Columns every loader returns (loaders may add more: `domain` for NoCaps, `boxes` for Visual Genome (one region
#: per caption) and for files with object boxes (one per object), normalised `[x1, y1, x2, y2]` (see `boxes.py`),
#: `image` for Hugging Face datasets whose images are embedded rather than files).
CAPTION_COLUMNS: tuple[str, ...] = ("image_id", "image_path", "captions", "split")

#: Karpathy split names; `restval` (the rest of COCO val2014) is part of the training split.
SPLITS: tuple[str, ...] = ("train", "val", "test")
SPLIT_ALIASES: dict[str, str] = {
    "train": "train",
    "restval": "train",
    "training": "train",
    "val": "val",
    "valid": "val",
    "validation": "val",
    "dev": "val",
    "test": "test",
    "testing": "test",
}

#: The command-line flag that lets a data file name images outside the image root.
OUTSIDE_ROOT_FLAG = "--allow-outside-image-root"

#: How many problem paths a report message lists before "... and N more".
REPORT_LIMIT = 10


class DataError(ValueError):
    """A dataset file or directory that cannot be used as given; the message names the input and the problem."""


class DataFormatError(DataError):
    """A malformed annotation file: `str(error)` names the file and the entry index / field at fault."""


@dataclass
class ImageReport:
    """Images that are missing, empty or do not decode, with the reason for each.

    Attributes:
        source: What was being loaded (an annotation file, a dataset name), named in messages.
        checked: How many images were checked.
        problems: `(image_path, reason)` for every unusable image, in dataset order.
        action: `"skipped"` (rows dropped, loading went on) or `"stopped"` (an error was raised).
        image_root: The image root the paths were resolved against, if any (named in the hint when nothing exists).
    """

    source: str
    checked: int
    problems: list[tuple[str, str]] = field(default_factory=list)
    action: str = "skipped"
    image_root: str | None = None

    def __bool__(self) -> bool:
        return bool(self.problems)

    @property
    def paths(self) -> list[str]:
        """The paths of all unusable images."""
        return [path for path, _ in self.problems]

    def summary(self, limit: int = REPORT_LIMIT) -> str:
        """One line: how many images are unusable out of how many, then the first `limit` paths with reasons."""
        if not self.problems:
            return f"{self.source}: all {self.checked:,} images are usable"
        listed = "; ".join(f"{path} ({reason})" for path, reason in self.problems[:limit])
        more = len(self.problems) - limit
        more_text = f"; ... and {more:,} more" if more > 0 else ""
        verb = "skipped" if self.action == "skipped" else "stopping"
        hint = ""
        if len(self.problems) == self.checked and self.checked > 1 and self.image_root is not None:
            hint = f" None of the images was found: is the image root {self.image_root} right (--image-root)?"
        elif self.action == "stopped":
            hint = " Pass on_missing='report' (--on-missing report) to skip them and go on."
        return (
            f"{self.source}: {len(self.problems):,} of {self.checked:,} images are missing or unusable, {verb}: "
            f"{listed}{more_text}.{hint}"
        )

    def merge(self, other: ImageReport) -> ImageReport:
        """A report covering this one and `other` (for the splits of a `DatasetDict`)."""
        return ImageReport(
            source=self.source,
            checked=self.checked + other.checked,
            problems=self.problems + other.problems,
            action="stopped" if "stopped" in (self.action, other.action) else self.action,
            image_root=self.image_root or other.image_root,
        )


class UnusableImagesError(DataError):
    """Raised with `on_missing="error"` / `on_error="error"`; `.report` lists every unusable image."""

    def __init__(self, report: ImageReport) -> None:
        super().__init__(report.summary())
        self.report = report


class UnusableImagesWarning(UserWarning):
    """Warned with `on_missing="report"`: the rows of unusable images were dropped; `.report` lists them all.

    Rebuilt from its message alone (pytest-xdist and pickle pass `args`), it has no report (`.report` is None).
    """

    def __init__(self, report: ImageReport | str) -> None:
        super().__init__(report if isinstance(report, str) else report.summary())
        self.report = None if isinstance(report, str) else report


class UnreadableTextWarning(UserWarning):
    """Entries of a caption file whose text (a caption, a file name) is not valid Unicode, e.g. a lone surrogate
    ("\\ud800", valid JSON) that no tokenizer or Arrow table takes, were skipped; the message names them."""


class EmptyCaptionsWarning(UserWarning):
    """Captions that are empty or only whitespace were dropped (never a target or a reference); the message counts
    them and names some of their images."""


def drop_empty_captions(rows: Sequence[dict[str, Any]], source: str, stacklevel: int = 3) -> None:
    """Remove empty or whitespace-only captions from each row's `captions`, in place, warning
    `EmptyCaptionsWarning` once (an image left without captions stays: NoCaps' test images have none).

    Args:
        rows: Rows with a `captions` list.
        source: The data, named in the warning.
        stacklevel: For the warning.
    """
    affected = []
    for row in rows:
        kept = [caption for caption in row["captions"] if caption.strip()]
        if len(kept) != len(row["captions"]):
            affected.append((row["image_id"], len(row["captions"]) - len(kept)))
            row["captions"] = kept
    if affected:
        examples = ", ".join(repr(image) for image, _ in affected[:REPORT_LIMIT])
        warnings.warn(
            EmptyCaptionsWarning(
                f"{source}: dropped {sum(count for _, count in affected)} empty caption(s) of {len(affected)} "
                f"image(s) (e.g. {examples})"
            ),
            stacklevel=stacklevel,
        )


class RepeatedImagesWarning(UserWarning):
    """Entries of a caption file that name the same image file (under different ids); the message names them."""


class SplitSizeWarning(UserWarning):
    """A split of a known dataset does not have its published size (the message names expected vs found)."""


def check_on_missing(value: str, name: str = "on_missing") -> OnMissing:
    """Validate an `on_missing` / `on_error` argument."""
    if value not in ON_MISSING_VALUES:
        raise ValueError(f"{name} must be one of {', '.join(ON_MISSING_VALUES)}; got {value!r}")
    return value  # type: ignore[return-value]


def split_named(name: str) -> str:
    """The split a name means: `train`, `val` or `test` for a known alias (`validation`, `dev`, `restval`, ...), else
    the name itself (a dataset's own split names, such as `holdout`, are kept).

    Args:
        name: A split name.
    """
    return SPLIT_ALIASES.get(str(name).strip().lower(), str(name))


def normalise_split(split: str, source: str = "split") -> str:
    """Map a split name or alias (`validation`, `dev`, `restval`, ...) to `train`, `val` or `test`."""
    key = str(split).strip().lower()
    if key not in SPLIT_ALIASES:
        raise ValueError(f"{source}: unknown split {split!r}; expected one of {', '.join(SPLITS)} (or an alias)")
    return SPLIT_ALIASES[key]


def read_json(path: str | os.PathLike, role: str | None = None) -> Any:
    """Parse a JSON file, with errors that name the file (and the line/column for syntax errors).

    Args:
        path: The file.
        role: What the file is (e.g. "predictions"), named when it is missing or a directory.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such {role + ' ' if role else ''}file")
    if path.is_dir():
        expected = f"the {role} JSON file" if role else "a JSON annotation file"
        raise DataFormatError(f"{path}: is a directory, expected {expected}")
    try:
        with path.open("rb") as handle:
            return json.load(handle)
    except RecursionError:
        raise DataFormatError(f"{path}: nested too deeply to read (maximum recursion depth exceeded)") from None
    except json.JSONDecodeError as error:
        raise DataFormatError(
            f"{path}: not valid JSON (line {error.lineno}, column {error.colno}: {error.msg})"
        ) from None
    except UnicodeDecodeError as error:
        raise DataFormatError(f"{path}: not valid JSON (not UTF-8 text: {error.reason})") from None


def image_id_text(value: Any, where: str, field: str = "id") -> str:
    """An image id from an annotation file as the rows' string id: a JSON string or integer (`1.0` is 1).

    Args:
        value: The id as the file gives it.
        where: The entry, for the message (`"data.json: images[3]"`).
        field: The field's name, for the message.

    Raises:
        DataFormatError: naming the entry and field, for any other value (a list, an object, a boolean, null).
    """
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, (int, str)) or value == "":
        raise DataFormatError(
            f"{where}: field {field!r} must be a string or an integer image id, got {json.dumps(value)[:60]}"
        )
    return str(value)


def absolute(path: str | os.PathLike) -> Path:
    """`path` made absolute without resolving symlinks (users see the paths they gave)."""
    return Path(os.path.abspath(os.path.expanduser(os.fspath(path))))


def file_problem(path: str) -> str | None:
    """The cheap check done at load time: why `path` is not a usable image file, or None if it may be one.

    Only existence, type and size are checked (one `stat`); whether the bytes decode is `verify_images`' job.
    """
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return "no such file"
    except NotADirectoryError:
        return "no such file (a parent is not a directory)"
    except OSError as error:
        return f"cannot be read ({error.strerror or error})"
    if os.path.isdir(path):
        return "is a directory, not an image"
    if stat.st_size == 0:
        return "empty file"
    return None


def drop_unusable(
    rows: Sequence[dict[str, Any]],
    problems: Iterable[tuple[int, str]],
    *,
    on_missing: OnMissing,
    source: str,
    image_root: str | None,
    stacklevel: int = 3,
) -> tuple[list[dict[str, Any]], ImageReport]:
    """Apply the skip-with-report / stop policy to `problems` (row index, reason) found among `rows`.

    Returns the kept rows and the report; raises `UnusableImagesError` with `on_missing="error"` when there are
    problems, and warns `UnusableImagesWarning` with `on_missing="report"`.
    """
    problems = sorted(problems)
    report = ImageReport(
        source=source,
        checked=len(rows),
        problems=[(rows[index]["image_path"], reason) for index, reason in problems],
        image_root=image_root,
    )
    if not problems or on_missing == "keep":
        return list(rows), report
    if on_missing == "error":
        report.action = "stopped"
        raise UnusableImagesError(report)
    warnings.warn(UnusableImagesWarning(report), stacklevel=stacklevel)
    bad = {index for index, _ in problems}
    return [row for index, row in enumerate(rows) if index not in bad], report


def is_under(path: str | os.PathLike, root: str | os.PathLike) -> bool:
    """Whether `path` lies inside the folder `root`, both with symlinks resolved (`..`, an absolute path or a
    symlink out of the folder all land outside it)."""
    return Path(os.path.realpath(root)) in Path(os.path.realpath(path)).parents


def check_under_root(
    rows: Sequence[dict[str, Any]], *, source: str, image_root: str | os.PathLike, option: str
) -> None:
    """Refuse rows whose `image_path` is outside `image_root`: a data file names its images, and an entry such as
    `"filepath": "../.."` or a symlink out of the root would otherwise make the package read any file.

    Args:
        rows: Rows with `image_id` and `image_path` (an empty path, an embedded image, is not checked).
        source: The data file, named in the message.
        image_root: The folder every image must lie in.
        option: How the caller allows paths outside the root (named in the message).

    Raises:
        DataError: naming the first entry outside the root, the root, and what to pass instead.
    """
    outside = [row for row in rows if row.get("image_path") and not is_under(row["image_path"], image_root)]
    if outside:
        first = outside[0]
        more = f" (and {len(outside) - 1:,} more)" if len(outside) > 1 else ""
        raise DataError(
            f"{source}: image {first['image_id']!r} is {first['image_path']}, outside the image root {image_root}"
            f"{more} (paths resolved): only files under the image root are read. Pass --image-root (image_root=) "
            f"a folder that holds every image, or {option} if you trust this data file"
        )


def check_files(
    rows: Sequence[dict[str, Any]],
    *,
    on_missing: OnMissing,
    source: str,
    image_root: str | None,
    allow_outside_root: bool = False,
) -> tuple[list[dict[str, Any]], ImageReport]:
    """Refuse images outside `image_root` (unless `allow_outside_root`), then run the cheap existence/size check on
    every row's `image_path` and apply `on_missing`."""
    if image_root is not None and not allow_outside_root:
        check_under_root(
            rows, source=source, image_root=image_root, option=f"{OUTSIDE_ROOT_FLAG} (allow_outside_root=True)"
        )
    problems = []
    for index, row in enumerate(rows):
        if row.get("image_path"):
            reason = file_problem(row["image_path"])
            if reason is not None:
                problems.append((index, reason))
    return drop_unusable(rows, problems, on_missing=on_missing, source=source, image_root=image_root, stacklevel=4)


def check_split_sizes(
    found: dict[str, int], expected: dict[str, int], *, source: str, what: str, stacklevel: int = 3
) -> str | None:
    """Warn `SplitSizeWarning` naming every split whose size differs from `expected`; returns the message or None.

    Args:
        found: Split name -> number of entries found (only the splits being loaded).
        expected: Split name -> published size.
        source: The file being loaded, named in the message.
        what: The dataset and split definition, e.g. "the Karpathy COCO split".
        stacklevel: Passed to `warnings.warn`.
    """
    differences = []
    for split, size in expected.items():
        if split not in found:
            continue
        count = found[split]
        if count != size:
            differences.append(f"{split} has {count:,} instead of {size:,} ({count - size:+,})")
    if not differences:
        return None
    message = f"{source}: split sizes differ from {what}: " + "; ".join(differences)
    warnings.warn(SplitSizeWarning(message), stacklevel=stacklevel)
    return message


def caption_features(extra: dict[str, Any] | None = None):
    """The `datasets.Features` of the common columns, plus `extra` ones."""
    from datasets import Features, List, Value

    features = {
        "image_id": Value("string"),
        "image_path": Value("string"),
        "captions": List(Value("string")),
        "split": Value("string"),
    }
    features.update(extra or {})
    return Features(features)


def rows_to_dataset(rows: list[dict[str, Any]], extra_features: dict[str, Any] | None = None):
    """A `datasets.Dataset` with the common columns (and `extra_features`) from a list of row dicts."""
    from datasets import Dataset

    features = caption_features(extra_features)
    columns = {name: [row[name] for row in rows] for name in features}
    return Dataset.from_dict(columns, features=features)


def split_rows(
    rows: list[dict[str, Any]],
    split: str | None,
    extra_features: dict[str, Any] | None = None,
    splits: Sequence[str] | None = None,
):
    """One `Dataset` of the rows of `split`, or (when `split` is None) a `DatasetDict` of the splits in `splits`
    (kept even if their rows were all dropped) and of any other split the rows have."""
    from datasets import DatasetDict

    if split is not None:
        return rows_to_dataset([row for row in rows if row["split"] == split], extra_features)
    names = {row["split"] for row in rows}
    present = list(splits) if splits is not None else [name for name in SPLITS if name in names]
    present += sorted(names - set(present))
    return DatasetDict(
        {name: rows_to_dataset([row for row in rows if row["split"] == name], extra_features) for name in present}
    )


def unique_ids(rows: Sequence[dict[str, Any]], source: str, where: str = "images") -> None:
    """Raise `DataFormatError` naming both entries when two rows share an `image_id`; warn `RepeatedImagesWarning`
    when two rows name the same image file (under other ids: across splits, a test score would include training
    images)."""
    seen: dict[str, int] = {}
    for index, row in enumerate(rows):
        image_id = row["image_id"]
        if image_id in seen:
            raise DataFormatError(
                f"{source}: {where}[{index}] has image id {image_id!r}, already used by {where}[{seen[image_id]}]"
            )
        seen[image_id] = index
    by_file: dict[str, list[int]] = {}
    for index, row in enumerate(rows):
        if row.get("image_path"):
            by_file.setdefault(os.path.normpath(row["image_path"]), []).append(index)
    repeated = {path: indices for path, indices in by_file.items() if len(indices) > 1}
    if not repeated:
        return
    crossing = [indices for indices in repeated.values() if len({rows[i]["split"] for i in indices}) > 1]
    splits = sorted({rows[i]["split"] for indices in crossing for i in indices})
    across = (
        f"; {len(crossing)} across splits ({', '.join(splits)}): a score would include images trained on"
        if crossing
        else ""
    )
    path, indices = next(iter(repeated.items()))
    entries = ", ".join(f"{where}[{i}]" for i in indices[:REPORT_LIMIT]) + (
        ", ..." if len(indices) > REPORT_LIMIT else ""
    )
    warnings.warn(
        RepeatedImagesWarning(
            f"{source}: {len(repeated)} image file(s) named by more than one entry (e.g. {path}: {entries}){across}"
        ),
        stacklevel=3,
    )

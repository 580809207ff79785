"""The registry of caption metrics: one `Metric` entry (`types.py`) per metric, in report order; the built-ins
(`builtin_metrics.py`) first, in coco-caption's order.

`CaptionScorer`, `normalize_metrics`, `ALL_METRICS`, `FAST_METRICS`, the `--metrics` options of `itune score` /
`itune eval` and the model cards all read this registry, so adding a metric is one `register_metric` call:

```python
from itune_hf.metrics import Metric, register_metric, score_captions

def words(captions):  # mean prediction length, per image too
    lengths = [len(h.split()) for h in captions.hypotheses]
    return {"Words": (sum(lengths) / len(lengths), lengths)}

register_metric(Metric("WORDS", keys=("Words",), score=words))
score_captions({1: "a dog"}, {1: ["a dog runs"]}, metrics=["words", "cider"])  # {"CIDEr": ..., "Words": 2.0}
```

This module imports only the standard library (the scorers import numpy when they run), so the CLI can build its
help from it without loading the metrics themselves.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .builtin_metrics import COCO_METRICS, METEOR_JAR, SCENE_METRIC_ENTRIES
from .types import Metric, MetricResult, TokenizedCaptions

__all__ = [
    "ALL_METRICS",
    "FAST_METRICS",
    "PRIMARY_METRIC",
    "Metric",
    "MetricResult",
    "SCENE_METRICS",
    "TokenizedCaptions",
    "card_metrics",
    "describe_metrics",
    "get_metric",
    "list_metrics",
    "metric_names",
    "normalize_metrics",
    "register_metric",
    "scene_metrics_for",
    "unregister_metric",
]

#: The metric model cards and `itune train` lead with (checkpoints are selected by it).
PRIMARY_METRIC = "CIDEr"

_REGISTRY: dict[str, Metric] = {}  # name -> metric, in report order
_SPELLINGS: dict[str, str] = {}  # lower-case name / key / alias -> name


def register_metric(metric: Metric, *, before: str | None = None) -> Metric:
    """Add `metric` to the registry; its keys are reported after those of the metrics before it.

    Args:
        metric: The entry.
        before: Name of a registered metric to insert it before; None appends it.

    Raises:
        ValueError: Its name, a key or an alias is already taken (names the metric that has it).
    """
    taken = {spelling: _SPELLINGS[spelling] for spelling in metric.spellings() if spelling in _SPELLINGS}
    if taken:
        clashes = [f"{spelling!r} (of {owner})" for spelling, owner in taken.items()]
        raise ValueError(f"Cannot register metric {metric.name!r}: {', '.join(clashes)} already taken")
    if before is not None and before not in _REGISTRY:
        raise ValueError(f"before={before!r} is not a registered metric; registered: {', '.join(_REGISTRY)}")
    entries = list(_REGISTRY.values())
    position = entries.index(_REGISTRY[before]) if before is not None else len(entries)
    entries.insert(position, metric)
    _REGISTRY.clear()
    _REGISTRY.update((entry.name, entry) for entry in entries)
    _SPELLINGS.update((spelling, metric.name) for spelling in metric.spellings())
    return metric


def unregister_metric(name: str) -> Metric:
    """Remove a metric from the registry and return its entry.

    Args:
        name: Its name or any spelling `get_metric` accepts.
    """
    metric = _REGISTRY.pop(get_metric(name).name)
    for spelling in metric.spellings():
        del _SPELLINGS[spelling]
    return metric


def get_metric(name: str) -> Metric:
    """The registered metric called `name` (its name, a result key or an alias; case-insensitive).

    Args:
        name: e.g. "BLEU", "Bleu_4", "rouge", "cider-d".

    Raises:
        ValueError: No metric has that name (lists the registered ones).
    """
    canonical = _SPELLINGS.get(name.strip().lower())
    if canonical is None:
        raise ValueError(f"Unknown metric {name!r}; choose from {', '.join(_REGISTRY)}")
    return _REGISTRY[canonical]


def list_metrics() -> tuple[Metric, ...]:
    """Every registered metric, in report order."""
    return tuple(_REGISTRY.values())


def metric_names(*, fast: bool | None = None) -> tuple[str, ...]:
    """Names of the registered metrics, in report order.

    Args:
        fast: True: only those ready at once (`Metric.fast`: no Java, no data to load); False: only the others;
            None: all.
    """
    return tuple(m.name for m in _REGISTRY.values() if fast is None or fast == m.fast)


def normalize_metrics(metrics: Iterable[str] | None) -> tuple[str, ...]:
    """Canonical metric names ("BLEU", "METEOR", "ROUGE_L", "CIDEr", "SPICE") in report (coco-caption) order.

    Args:
        metrics: Names, case-insensitive ("bleu", "Bleu_4", "rouge", "cider-d"...); any key of a metric selects
            the whole metric (Bleu_4 means Bleu_1..Bleu_4, as in coco-caption). None for every registered metric
            scored by default (`Metric.by_default`).

    Raises:
        ValueError: An unknown name, or none at all.
    """
    if metrics is None:
        return tuple(m.name for m in _REGISTRY.values() if m.by_default)
    if isinstance(metrics, str):
        metrics = [metrics]
    chosen = {get_metric(name).name for name in metrics}
    if not chosen:
        raise ValueError(f"No metric requested; choose from {', '.join(_REGISTRY)}")
    return tuple(name for name in _REGISTRY if name in chosen)


def card_metrics() -> tuple[Metric, ...]:
    """The metrics model cards report: `PRIMARY_METRIC` first, then the others with a `card_name`, in report order."""
    shown = [m for m in _REGISTRY.values() if m.card_name is not None]
    return tuple(sorted(shown, key=lambda m: m.name != PRIMARY_METRIC))  # stable: the others keep their order


def describe_metrics() -> str:
    """The registered metrics for help texts: "BLEU (Bleu_1..Bleu_4), METEOR, ROUGE_L, CIDEr, SPICE (needs Java),
    ..."."""
    parts = []
    for metric in _REGISTRY.values():
        notes = []
        if metric.keys != (metric.name,):
            notes.append(f"{metric.keys[0]}..{metric.keys[-1]}" if len(metric.keys) > 2 else ", ".join(metric.keys))
        if metric.needs_java:
            notes.append("needs Java")
        parts.append(f"{metric.name} ({'; '.join(notes)})" if notes else metric.name)
    return ", ".join(parts)


for _metric in COCO_METRICS:
    register_metric(_metric)

#: coco-caption's metrics, in its order (`metric_names()` also lists the scene metrics and any registered later).
ALL_METRICS: tuple[str, ...] = metric_names()
#: coco-caption's metrics that are ready at once (no Java, no data to load): BLEU, ROUGE_L, CIDEr.
FAST_METRICS: tuple[str, ...] = metric_names(fast=True)

for _metric in (*SCENE_METRIC_ENTRIES, METEOR_JAR):
    register_metric(_metric)
del _metric
#: The built-in metrics that need each image's recorded scene (`Metric.needs_scenes`).
SCENE_METRICS: tuple[str, ...] = tuple(m.name for m in list_metrics() if m.needs_scenes)


def scene_metrics_for(scenes: Mapping[Any, Any] | None) -> tuple[str, ...]:
    """The built-in scene metrics (`SCENE_METRICS`) that read what the data records (`read_scenes`): `Objects` for a
    generated world's scenes, `ContentWords` for a clip-art corpus's content words, `CHAIR` for either and for COCO
    instance annotations; () for none. The commands add these to their default metrics, so that a metric that cannot
    apply to the data is not reported by default.

    Args:
        scenes: Image id -> record (`itune_hf.data.scenes.scenes_of_data`), or None.
    """
    records = [record for record in (scenes or {}).values() if record is not None]
    return tuple(name for name in SCENE_METRICS if any(get_metric(name).reads(record) for record in records))

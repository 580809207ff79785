"""METEOR and SPICE through pycocoevalcap's Java tools, when they can run; otherwise a reason, never a number.

METEOR 1.5 ships inside pycocoevalcap (its jar and paraphrase table) and runs offline given Java. SPICE also
needs Stanford CoreNLP 3.6.0, which pycocoevalcap downloads from nlp.stanford.edu the first time SPICE runs; we
never start that download (it would hang or fail offline), so without those jars SPICE is reported unavailable.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Hashable, Mapping, Sequence

__all__ = ["JavaMetric", "unavailable_reason"]

UNAVAILABLE = "unavailable: "
_CORENLP_JARS = ("stanford-corenlp-3.6.0.jar", "stanford-corenlp-3.6.0-models.jar")


def _package_dir(subpackage: str) -> str | None:
    spec = importlib.util.find_spec(f"pycocoevalcap.{subpackage}")
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def unavailable_reason(metric: str) -> str | None:
    """Why `metric` ("METEOR" or "SPICE") cannot run here, as "unavailable: <reason>"; None if it can.

    Args:
        metric: "METEOR" or "SPICE".
    """
    if importlib.util.find_spec("pycocoevalcap") is None:
        return f"{UNAVAILABLE}{metric} runs pycocoevalcap's Java tools; pycocoevalcap is not installed"
    if shutil.which("java") is None:
        return f"{UNAVAILABLE}{metric} needs Java (no `java` on PATH)"
    if metric == "SPICE":
        spice_dir = _package_dir("spice")
        if spice_dir is None:
            return f"{UNAVAILABLE}pycocoevalcap has no spice package"
        lib = os.path.join(spice_dir, "lib")
        missing = [jar for jar in _CORENLP_JARS if not os.path.exists(os.path.join(lib, jar))]
        if missing:
            return (
                f"{UNAVAILABLE}SPICE needs Stanford CoreNLP 3.6.0 ({', '.join(missing)} in {lib}), which "
                "pycocoevalcap downloads from nlp.stanford.edu on first use; it is not there and is not downloaded "
                "here (run `python -m pycocoevalcap.spice.get_stanford_models` once on a machine with network)"
            )
    return None


class JavaMetric:
    """A METEOR or SPICE scorer backed by pycocoevalcap; the Java process is started on first use and reused.

    Args:
        metric: "METEOR" or "SPICE".
    """

    def __init__(self, metric: str) -> None:
        if metric not in ("METEOR", "SPICE"):
            raise ValueError(f"Unknown Java metric {metric!r}; expected METEOR or SPICE")
        self.metric = metric
        self._scorer = None

    def score(
        self, references: Mapping[Hashable, Sequence[str]], predictions: Mapping[Hashable, Sequence[str]]
    ) -> tuple[float, list[float]] | str:
        """Score tokenised captions the way coco-caption does.

        Args:
            references: Image id -> tokenised references.
            predictions: Image id -> [tokenised prediction], same ids in the same order.

        Returns:
            (corpus score, per-image scores in the order of `references`), or "unavailable: <reason>".
        """
        reason = unavailable_reason(self.metric)
        if reason is not None:
            return reason
        gts = {key: list(refs) for key, refs in references.items()}
        res = {key: list(predictions[key]) for key in references}
        try:
            if self.metric == "METEOR":
                if self._scorer is None:
                    from pycocoevalcap.meteor.meteor import Meteor

                    self._scorer = Meteor()
                score, scores = self._scorer.compute_score(gts, res)
                return float(score), [float(s) for s in scores]
            from pycocoevalcap.spice.spice import Spice

            score, scores = Spice().compute_score(gts, res)  # per-image scores in sorted id order
            by_id = dict(zip(sorted(gts), (float(s["All"]["f"]) for s in scores)))
            return float(score), [by_id[key] for key in gts]
        except Exception as error:  # the Java tool failed: report it, never a number
            self.close()
            return f"{UNAVAILABLE}{self.metric} failed: {type(error).__name__}: {error}".strip()

    def close(self) -> None:
        """Stop the Java process, if one was started."""
        scorer, self._scorer = self._scorer, None
        if scorer is not None:
            process = getattr(scorer, "meteor_p", None)
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
            lock = getattr(scorer, "lock", None)
            if lock is not None and lock.locked():  # left held by a failed call; its __del__ would wait forever
                lock.release()

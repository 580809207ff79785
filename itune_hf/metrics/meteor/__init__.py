"""METEOR 1.5 in pure Python, equal to pycocoevalcap's jar (`-l en -norm`) to the printed digit.

* `MeteorScorer().compute_score(gts, res)`: pycocoevalcap's `Meteor().compute_score`, without Java.
* `normalize.py`: the jar's English normalisation; `align.py`: its four matching modules and beam search;
  `scoring.py`: the score from the alignment statistics; `language_data.py`: the function words, synonym sets and
  paraphrase table read from the installed pycocoevalcap, with the compact cache that makes loading them fast.
"""

from __future__ import annotations

from .scoring import MeteorScorer, meteor_score, unavailable_reason

__all__ = ["MeteorScorer", "meteor_score", "unavailable_reason"]

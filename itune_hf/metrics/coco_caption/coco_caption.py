"""coco-caption scores (BLEU-1..4, METEOR, ROUGE-L, CIDEr-D, SPICE) as a Hugging Face `evaluate` metric.

Load it from its local path; nothing is fetched from the Hub, so it works offline:

```python
import evaluate
from itune_hf.metrics import EVALUATE_MODULE_DIR

coco = evaluate.load(EVALUATE_MODULE_DIR)
coco.compute(predictions=["a dog runs"], references=[["a dog is running", "a brown dog runs"]])
```

The scores are those of `itune_hf.metrics.score_captions` (equal to pycocoevalcap 1.2).
"""

import datasets
import evaluate

from itune_hf.metrics import FAST_METRICS, score_captions

_DESCRIPTION = """\
coco-caption's caption metrics computed in pure Python: PTB tokenisation as the Stanford tokenizer does it for
coco-caption, BLEU-1..4 (closest reference length), ROUGE-L (beta 1.2), CIDEr-D (sigma 6, document frequencies over
the references, or over `idf_corpus`), and METEOR / SPICE through pycocoevalcap's Java tools when they can run
(otherwise the value is "unavailable: <reason>"). Keys and scales are coco-caption's.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions: list of predicted captions, one per image.
    references: list of lists of reference captions, one list per image.
    metrics: metrics to compute, any of "BLEU", "METEOR", "ROUGE_L", "CIDEr", "SPICE" (default: BLEU, ROUGE_L and
        CIDEr, which need no Java).
    idf_corpus: optional list of reference lists whose document frequencies CIDEr-D uses instead.
    tokenized: the captions are already tokenised (skip PTB tokenisation).
Returns:
    dict with "Bleu_1".."Bleu_4", "METEOR", "ROUGE_L", "CIDEr", "SPICE" (those requested).
Examples:
    >>> coco = evaluate.load(itune_hf.metrics.EVALUATE_MODULE_DIR)
    >>> sorted(coco.compute(predictions=["a dog runs"], references=[["a dog runs", "a dog"]]))
    ['Bleu_1', 'Bleu_2', 'Bleu_3', 'Bleu_4', 'CIDEr', 'ROUGE_L']
"""

_CITATION = """\
@article{chen2015microsoft,
  title={Microsoft COCO Captions: Data Collection and Evaluation Server},
  author={Chen, Xinlei and Fang, Hao and Lin, Tsung-Yi and Vedantam, Ramakrishna and Gupta, Saurabh and
          Doll{\\'a}r, Piotr and Zitnick, C. Lawrence},
  journal={arXiv preprint arXiv:1504.00325},
  year={2015}
}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class CocoCaption(evaluate.Metric):
    """coco-caption metrics (pure Python BLEU, ROUGE-L, CIDEr-D; METEOR and SPICE when Java can run)."""

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=[  # several references per prediction, or one string each (as evaluate's bleu and rouge take)
                datasets.Features(
                    {
                        "predictions": datasets.Value("string"),
                        "references": datasets.Sequence(datasets.Value("string")),
                    }
                ),
                datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("string")}),
            ],
            reference_urls=["https://github.com/tylin/coco-caption"],
        )

    def _compute(self, predictions, references, metrics=FAST_METRICS, idf_corpus=None, tokenized=False):
        ids = range(len(predictions))
        return score_captions(
            dict(zip(ids, predictions)),
            dict(zip(ids, ([refs] if isinstance(refs, str) else list(refs) for refs in references))),
            metrics=metrics,
            idf_corpus=idf_corpus,
            tokenized=tokenized,
        )

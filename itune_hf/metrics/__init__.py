"""Caption evaluation metrics, coco-caption compatible, in pure Python (see `itune_hf.metrics.ptb_tokenizer`)."""

from .ptb_tokenizer import PUNCTUATIONS, tokenize, tokenize_captions

__all__ = ["PUNCTUATIONS", "tokenize", "tokenize_captions"]

"""What every model card of a cross-attention baseline says about the method (see `itune_hf.hub.cards`)."""

from __future__ import annotations

from ...hub.cards import CardInfo, FamilyCard


def _parts(info: CardInfo) -> list[str]:
    return [
        f"Vision encoder (frozen): `{info.vision_model}`",
        f"Language model (frozen, cross-attention blocks added): `{info.text_model}`",
        f"Trainable cross-attention parameters: {info.trainable_parameters:,}",
        "Files: the full `VisionEncoderDecoderModel` weights (model type `crossattn`) with its code, so it also loads "
        "with `trust_remote_code=True` where `itune_hf` is not installed.",
    ]


CARD = FamilyCard(
    title="Cross-attention fine-tuning",
    paper_url="https://huggingface.co/docs/transformers/model_doc/vision-encoder-decoder",
    about="A [VisionEncoderDecoder]({paper_url})-style captioner whose frozen causal LM gets a new cross-attention "
    "block\n(+ layer norm) in every layer, attending to the frozen vision encoder's tokens; only those blocks train. "
    "A baseline for I-Tuning,\nwhose modules are lighter and sit in parallel to the feed-forward blocks instead.",
    parts=_parts,
    citation="""@article{li2021trocr,
  title={TrOCR: Transformer-based Optical Character Recognition with Pre-trained Models},
  author={Li, Minghao and Lv, Tengchao and Cui, Lei and Lu, Yijuan and Florencio, Dinei and Zhang, Cha and
          Li, Zhoujun and Wei, Furu},
  journal={arXiv preprint arXiv:2109.10282},
  year={2021}
}""",
    tag="vision-encoder-decoder",
    classes=("CrossAttnForCaptioning", "ITuningProcessor"),
    num_beams=5,
    limitation="Needs an LM architecture with cross-attention blocks (GPT-2, BERT-style), not Llama-family LMs.",
    untrained="Not trained yet: a preset definition (random cross-attention blocks).",
)

__all__ = ["CARD"]

"""What every model card of a ClipCap model says about the method (see `itune_hf.hub.cards`)."""

from __future__ import annotations

from ...hub.cards import CardInfo, FamilyCard


def _parts(info: CardInfo) -> list[str]:
    return [
        f"Vision encoder (frozen): `{info.vision_model}`",
        f"Language model (frozen): `{info.text_model}`",
        f"Trainable mapping-network parameters: {info.trainable_parameters:,}",
        "Files: the full model (frozen backbones and the mapper) with its code, so it also loads with "
        "`trust_remote_code=True` where `itune_hf` is not installed.",
    ]


CARD = FamilyCard(
    title="ClipCap",
    paper_url="https://arxiv.org/abs/2111.09734",
    about="ClipCap ([paper]({paper_url})) maps the frozen vision encoder's image embedding to a prefix of LM input "
    "embeddings\nwith a small mapping network (an MLP or a transformer); the captions continue that prefix in a frozen "
    "causal LM.\nHere only the mapping network is trained (the paper's frozen-LM variant), as a baseline for I-Tuning.",
    parts=_parts,
    citation="""@article{mokady2021clipcap,
  title={ClipCap: CLIP Prefix for Image Captioning},
  author={Mokady, Ron and Hertz, Amir and Bermano, Amit H.},
  journal={arXiv preprint arXiv:2111.09734},
  year={2021}
}""",
    tag="clipcap",
    classes=("ClipCapForCaptioning", "ITuningProcessor"),
    num_beams=5,
    limitation="The image reaches the LM only through one pooled embedding (the CLS state), mapped to a fixed prefix.",
    untrained="Not trained yet: a preset definition (random mapping network).",
)

__all__ = ["CARD"]

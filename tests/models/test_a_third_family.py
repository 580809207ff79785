"""A newcomer's family, written outside the package: its folder and one registration call are all it takes for the
Auto classes, the pipeline, `itune train`, `itune caption` and the model card to reach it.

The toy family ("toy") is ClipCap under another model type, so the test is about the house, not the model: nothing
in `itune_hf/` names it, and the package is imported before the family registers (as a plug-in's would be).
"""

from __future__ import annotations

import importlib
import json
import sys
import textwrap

import pytest
import torch

from itune_hf import cli

from conftest import write_photo

TOY = {
    "__init__.py": """
        from itune_hf.models import ModelFamily, register_family

        FAMILY = register_family(ModelFamily(
            name="toy", model_type="toy", description="A toy family: ClipCap under another name",
            config_class="toyfamily.configuration_toy:ToyConfig",
            model_class="toyfamily.modeling_toy:ToyForCaptioning",
            processor_class="itune_hf.models.ituning.processing_ituning:ITuningProcessor",
            settings_class=None, build_for_training="toyfamily.training:build_for_training", saves="full",
            display_name="Toy", card="toyfamily.card:CARD", training_defaults={"learning_rate": 3e-3},
        ))
    """,
    "card.py": """
        import dataclasses

        from itune_hf.hub.cards import family_card

        CLASSES = ("ToyForCaptioning", "ITuningProcessor")
        CARD = dataclasses.replace(family_card("clipcap"), title="Toy", tag="toy", classes=CLASSES)
    """,
    "configuration_toy.py": """
        from itune_hf.models.clipcap.configuration_clipcap import ClipCapConfig

        class ToyConfig(ClipCapConfig):
            model_type = "toy"
    """,
    "modeling_toy.py": """
        from itune_hf.models.clipcap.modeling_clipcap import ClipCapForCaptioning
        from .configuration_toy import ToyConfig

        class ToyForCaptioning(ClipCapForCaptioning):
            config_class = ToyConfig
    """,
    "training.py": """
        from transformers import AutoModel, AutoModelForCausalLM, CLIPImageProcessorPil, GPT2TokenizerFast

        from itune_hf.models import TrainingModel
        from itune_hf.models.ituning.processing_ituning import ITuningProcessor
        from itune_hf.models.packaged_backbones import gpt2_tokenizer_dir
        from .configuration_toy import ToyConfig
        from .modeling_toy import ToyForCaptioning

        def build_for_training(config):
            vision = AutoModel.from_pretrained(config.vision_model)
            text = AutoModelForCausalLM.from_pretrained(config.text_model)
            model_config = ToyConfig.from_vision_text_configs(vision.config, text.config)
            model = ToyForCaptioning(model_config, vision_model=vision, language_model=text)
            model.freeze_backbones()
            size = vision.config.image_size
            images = CLIPImageProcessorPil(size={"shortest_edge": size}, crop_size={"height": size, "width": size})
            processor = ITuningProcessor(images, GPT2TokenizerFast.from_pretrained(gpt2_tokenizer_dir()))
            return TrainingModel(model, model, processor, description="toy mapper parameters")
    """,
}


@pytest.fixture
def toy_family(tmp_path, monkeypatch):
    """Write the toy family's folder, import it (registering it), and take it out again afterwards."""
    from itune_hf.models import registry

    folder = tmp_path / "plugins" / "toyfamily"
    folder.mkdir(parents=True)
    for name, text in TOY.items():
        (folder / name).write_text(textwrap.dedent(text).lstrip())
    monkeypatch.syspath_prepend(str(folder.parent))
    monkeypatch.setattr(registry, "_FAMILIES", dict(registry._FAMILIES))
    from transformers import AutoConfig  # the Auto classes are registered before the family exists

    AutoConfig.for_model("clipcap")
    toyfamily = importlib.import_module("toyfamily")
    yield toyfamily.FAMILY
    for module in [m for m in sys.modules if m.split(".")[0] == "toyfamily"]:
        del sys.modules[module]


@pytest.mark.slow
def test_a_family_registered_from_its_own_folder_trains_saves_loads_and_captions(
    toy_family, backbone_dirs, tmp_path, capsys
):
    from transformers import AutoModelForImageTextToText, AutoProcessor, pipeline

    from itune_hf.data import make_synthetic
    from itune_hf.models import family_of

    world = make_synthetic(tmp_path / "world", num_images=12, seed=4, image_size=32)
    vision, text = backbone_dirs
    out = tmp_path / "run"
    args = ["train", "--preset", "none", "--family", "toy", "--vision-model", vision, "--text-model", text]
    args += ["--data", world, "--output-dir", out, "--max-steps", 2, "--batch-size", 4, "--report-to", "none"]
    args += ["--eval-max-images", 2, "--eval-max-new-tokens", 3]
    assert cli.main(list(map(str, args))) == 0
    assert "learning_rate 0.003 (family toy)" in capsys.readouterr().out
    assert "Toy" in (out / "README.md").read_text()

    model = AutoModelForImageTextToText.from_pretrained(out).eval()
    assert family_of(model) is toy_family and type(model).__name__ == "ToyForCaptioning"
    processor = AutoProcessor.from_pretrained(out)
    photo = str(write_photo(tmp_path / "photo.png"))
    ids = model.generate(**processor(images=[photo]), num_beams=1, max_new_tokens=3)
    expected = processor.batch_decode(ids)[0]
    assert pipeline("image-to-text", model=str(out))(photo, num_beams=1, max_new_tokens=3)[0]["generated_text"] == (
        expected
    )
    assert cli.main(["caption", photo, "--model", str(out), "--num-beams", "1", "--max-new-tokens", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["caption"] == expected
    assert torch.equal(ids, model.generate(**processor(images=[photo]), num_beams=1, max_new_tokens=3))

"""Model cards: the committed preset cards parse with the Hub's ModelCard, match the generator, and their usage snippets
run against a tiny model; cards of trained models carry their real settings and measured scores; card metadata names
only Hub ids (a plain PEFT save's card too), and the text says where local backbones are."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard

from itune_hf import ITuningAdapterConfig, build_model
from itune_hf.hub.cards import (
    CardInfo,
    add_test_results,
    describe_training_data,
    paper_results,
    preset_card,
    render_card,
)
from itune_hf.presets import list_presets

from conftest import code_blocks, run_python_snippet, write_photo

CARDS = Path(__file__).resolve().parents[2] / "model_cards"
PAPER_PRESETS = ["itune-gpt2-base", "itune-gpt2-medium", "itune-gpt2-large", "itune-gpt2-large-drop18"]


XGPT_CARDS = ["xgpt-base"]


def test_there_is_a_card_for_each_paper_preset():
    assert sorted(p.stem for p in CARDS.glob("*.md")) == sorted(PAPER_PRESETS + XGPT_CARDS)
    assert set(PAPER_PRESETS + XGPT_CARDS) <= set(list_presets())


@pytest.mark.parametrize("name", XGPT_CARDS)
def test_committed_xgpt_card_is_what_the_generator_writes(name):
    assert (CARDS / f"{name}.md").read_text() == str(preset_card(name)), (
        f"model_cards/{name}.md is stale: regenerate it with itune_hf.hub.cards.preset_card({name!r})"
    )


def test_xgpt_card_keeps_paper_numbers_out_of_the_model_index_and_says_what_its_regions_are():
    card = ModelCard.load(CARDS / "xgpt-base.md")
    assert card.data.eval_results is None  # the model-index holds only measured results: none yet
    assert card.data.base_model == ["openai/clip-vit-base-patch16"] and "xgpt" in card.data.tags
    rows = {line for line in card.text.splitlines() if "paper (reported, not reproduced here)" in line}
    expected = {(r["dataset"], m, v) for r in paper_results()["xgpt-base"] for m, v in r["metrics"].items()}
    assert len(rows) == len(expected) == 8
    assert all(f"| {dataset} |" in " ".join(rows) and f"| {metric} | {value} |" in " ".join(rows)
               for dataset, metric, value in expected)  # fmt: skip
    assert "not detector regions: not comparable to the paper's numbers" in card.text
    assert "beam search with 2 beams" in card.text and "arxiv.org/abs/2003.01473" in card.text


def test_xgpt_card_python_snippets_run_against_a_tiny_model(tmp_path):
    from itune_hf import build_model, build_processor
    from itune_hf.hub import save_captioner

    model_dir = save_captioner(
        build_model("xgpt-tiny-random"), tmp_path / "xgpt", processor=build_processor("xgpt-tiny-random")
    )
    photo = write_photo(tmp_path / "photo.jpg")
    replacements = {"outputs/xgpt-base": str(model_dir), '"photo.jpg"': repr(str(photo))}
    snippets = code_blocks((CARDS / "xgpt-base.md").read_text(), "python")
    assert len(snippets) == 1 and "XGPTForCaptioning" in snippets[0]
    for snippet in snippets:
        assert run_python_snippet(snippet, replacements).strip()


@pytest.mark.parametrize("name", PAPER_PRESETS)
def test_committed_card_is_what_the_generator_writes(name):
    assert (CARDS / f"{name}.md").read_text() == str(preset_card(name)), (
        f"model_cards/{name}.md is stale: regenerate it with itune_hf.hub.cards.preset_card({name!r})"
    )


@pytest.mark.parametrize("name", PAPER_PRESETS)
def test_card_metadata_parses_and_labels_paper_numbers(name):
    card = ModelCard.load(CARDS / f"{name}.md")
    data = card.data
    assert data.library_name == "transformers" and data.pipeline_tag == "image-to-text"
    assert data.license == "apache-2.0" and data.base_model[0] == "openai/clip-vit-base-patch16"
    assert data.datasets is None  # an untrained preset was trained on nothing; the paper's datasets are in the text
    # The model-index holds measured results only (none for an untrained preset): the Hub shows model-index entries
    # as this model's results. The paper's numbers are in the text, each row labelled as reported.
    assert data.eval_results is None
    rows = [line for line in card.text.splitlines() if line.endswith("| paper (reported, not reproduced here) |")]
    expected = {(r["dataset"], m, v) for r in paper_results()[name] for m, v in r["metrics"].items()}
    found = {(cells[0], cells[3], float(cells[4])) for cells in (line.strip("|").split(" | ") for line in rows)}
    assert {(d.strip(), m.strip(), v) for d, m, v in found} == expected
    for section in ("## Intended use", "## Limitations", "## Evaluation protocol", "beam search with 5 beams"):
        assert section in card.text


@pytest.mark.parametrize("name", PAPER_PRESETS + XGPT_CARDS)
def test_an_untrained_preset_card_says_so_and_shows_how_to_train_it(name):
    card = ModelCard.load(CARDS / f"{name}.md")
    setup_cfg = (CARDS.parent / "setup.cfg").read_text()
    assert "license = Apache-2.0" in setup_cfg and card.data.license == "apache-2.0"  # one license everywhere
    assert card.text.splitlines()[1] == f"# {name}: a configuration, not a trained model"
    assert "itune-hf/" not in card.text  # no snippet loads a Hub repository that does not exist
    assert f"itune train --preset {name} " in card.text and "natural images" not in card.text
    assert "parameter-efficient" not in card.text and "Files:" not in card.text


@pytest.mark.parametrize("name", PAPER_PRESETS)
def test_card_python_snippets_run_against_a_tiny_model(name, captioner_dirs, tmp_path):
    text = (CARDS / f"{name}.md").read_text()
    photo = write_photo(tmp_path / "photo.jpg")
    replacements = {f"outputs/{name}": str(captioner_dirs["full"]), '"photo.jpg"': repr(str(photo))}
    python_snippets = code_blocks(text, "python")
    assert len(python_snippets) == 1
    for snippet in python_snippets:
        assert run_python_snippet(snippet, replacements).strip()  # prints a caption


@pytest.mark.slow
def test_card_command_line_snippet_runs(captioner_dirs, tmp_path):
    commands = {name: code_blocks((CARDS / f"{name}.md").read_text(), "bash") for name in PAPER_PRESETS}
    assert all(len(blocks) == 1 for blocks in commands.values())
    templates = {blocks[0].splitlines()[-1].replace(f"outputs/{name}", "MODEL") for name, blocks in commands.items()}
    assert len(templates) == 1  # the same caption command in every card: running it once covers all four
    folder = tmp_path / "photos"
    folder.mkdir()
    write_photo(folder / "a.png")
    write_photo(tmp_path / "photo.jpg")
    template = templates.pop().replace("photos/", str(folder))
    command = shlex.split(template.replace("MODEL", str(captioner_dirs["full"])))
    assert command[0] == "itune"
    command[0] = str(Path(sys.executable).parent / "itune")
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert len(result.stdout.strip().splitlines()) == 2


def test_trained_adapter_card_reports_measured_scores_and_settings():
    info = CardInfo(
        model_id="me/itune-demo",
        title="itune-demo",
        summary="Trained on the synthetic caption world.",
        vision_model="vision-ref",
        text_model="text-ref",
        trainable_parameters=123456,
        adapter=True,
        license="apache-2.0",
        results=[
            {
                "dataset": "synthetic test",
                "dataset_id": "itune-synthetic",
                "split": "test",
                "setting": "",
                "metrics": {"CIDEr": 87.5, "BLEU-4": 40.1},
                "source": "measured",
            }
        ],
        training={"steps": 300, "learning rate": 1e-3, "seed": 0},
    )
    card = ModelCard(str(render_card(info)))
    assert card.data.library_name == "peft" and "peft" in card.data.tags
    assert {r.metric_value for r in card.data.eval_results} == {87.5, 40.1}
    assert not any("paper" in r.metric_name for r in card.data.eval_results)
    assert "| steps | 300 |" in card.text and "123,456" in card.text and "no backbone weight is stored" in card.text


def test_a_card_names_the_synthetic_world_it_was_trained_on_and_carries_its_test_results(tmp_path):
    from itune_hf.data.synthetic import make_synthetic

    world = make_synthetic(tmp_path / "world", num_images=12, image_size=24, seed=3)
    trained_on = describe_training_data(str(world))
    assert "synthetic caption world" in trained_on and "seed 3, 12 images of 24x24" in trained_on
    assert "no natural image" in describe_training_data("synthetic")
    assert describe_training_data("dataset_coco.json") == "`dataset_coco.json`"
    info = CardInfo(
        model_id="demo", title="demo", summary="s", vision_model="v", text_model="t", trainable_parameters=1,
        adapter=True, training={"steps": 3}, trained_on=trained_on,
    )  # fmt: skip
    card_path = tmp_path / "README.md"
    card_path.write_text(str(render_card(info)))
    add_test_results(card_path, "100 test images, 3 beams.", {"adapter": {"CIDEr": 1.134, "Object_F1": 0.22},
                                                              "adapter disabled": {"CIDEr": 0.001}})  # fmt: skip
    card = ModelCard.load(card_path)
    assert f"like those it was trained on ({trained_on})" in card.text and "natural images" not in card.text
    results = card.text[card.text.index("## Test results") : card.text.index("## Citation")]
    assert "| adapter | 113.4 | 22.0 |" in results and "| adapter disabled | 0.1 | - |" in results


def test_card_metadata_holds_only_hub_ids_and_the_text_says_where_backbones_are(tmp_path):
    from huggingface_hub import ModelCard

    from itune_hf.hub.cards import CardInfo, render_card

    data = tmp_path / "captions.json"
    data.write_text("[]")
    info = CardInfo(
        model_id="run", title="run", summary="A run.", vision_model="random, stored here in backbones/vision",
        text_model="gpt2", trainable_parameters=10, adapter=True, license="mit",
        results=[{"dataset": "local", "dataset_id": str(data), "split": "val", "setting": "", "metrics": {"CIDEr": 1.0},
                  "source": "measured"}],
    )  # fmt: skip
    card = ModelCard(str(render_card(info)))
    assert card.data.base_model == ["gpt2"] and not card.data.eval_results
    assert "stored here under `backbones/`" in card.text and "no backbone weight is stored" not in card.text
    assert "CIDEr" in card.text  # the local dataset's measured result stays in the text


def test_a_plain_peft_save_writes_a_valid_card_and_loads_back(backbone_dirs, tmp_path):
    from huggingface_hub import ModelCard
    from peft import AutoPeftModel, get_peft_model

    from itune_hf import ITuningForCaptioning

    hub_named = build_model("itune-tiny-random", add_ituning_modules=False)  # as if built from these Hub backbones
    hub_named.config.vision_config._name_or_path = "openai/clip-vit-base-patch32"
    hub_named.config.text_config._name_or_path = "gpt2"
    get_peft_model(hub_named, ITuningAdapterConfig()).save_pretrained(tmp_path / "hub")
    card = ModelCard.load(tmp_path / "hub" / "README.md").data
    assert card.base_model == ["openai/clip-vit-base-patch32", "gpt2"] and "base_model:adapter:gpt2" in card.tags
    vision, text = (str(p) for p in backbone_dirs)  # local backbones: no Hub id to name, none is invented
    base = ITuningForCaptioning.from_vision_text_pretrained(vision, text, add_ituning_modules=False)
    torch.manual_seed(2)
    adapted = get_peft_model(base, ITuningAdapterConfig(first_layer=1, init="random")).eval()
    adapted.save_pretrained(tmp_path / "local")
    card = ModelCard.load(tmp_path / "local" / "README.md").data
    assert card.base_model is None and not any(tag.startswith("base_model:") for tag in card.tags)
    recorded = json.loads((tmp_path / "local" / "adapter_config.json").read_text())
    assert recorded["base_model_name_or_path"] is None and recorded["backbones"] == [vision, text]
    pixels = torch.randn(1, 3, 32, 32)
    ids = adapted.generate(pixel_values=pixels, num_beams=1, max_new_tokens=4)
    restored = ITuningForCaptioning.from_pretrained(tmp_path / "local")  # the base rebuilt from `backbones`
    assert torch.equal(restored.generate(pixel_values=pixels, num_beams=1, max_new_tokens=4), ids)
    with pytest.raises(ValueError, match="names no base to rebuild.*from_pretrained\\(folder\\)"):
        AutoPeftModel.from_pretrained(tmp_path / "local", import_allowlist=["itune_hf"])


def _trained_card(preset_name: str, tmp_path, processes: int = 1, data: str = "synthetic", **config) -> ModelCard:
    """The card `itune train` writes for a run of `preset_name` (validated, scores given), without training."""
    from itune_hf.hub.cards import training_card
    from itune_hf.models.registry import ModelFacts
    from itune_hf.presets import get_preset
    from itune_hf.training.config import TrainingConfig

    preset = get_preset(preset_name)
    model_config = preset.config()
    run = TrainingConfig(preset=preset_name, data=data, output_dir=str(tmp_path / "run"), **config)
    facts = ModelFacts(model_config, 1000, model_config.settings, "I-Tuning parameters")
    return ModelCard(str(training_card(run, facts, {"CIDEr": 1.5, "Object_F1": 0.5}, step=100, processes=processes)))


@pytest.mark.parametrize("data", ["synthetic", "photos"])
def test_a_trained_card_names_no_hub_dataset_for_the_built_in_data(tmp_path, data):
    card = _trained_card("itune-tiny-random", tmp_path, data=data)
    assert card.data.datasets is None and card.data.eval_results is None  # the Hub would link hf.co/datasets/...
    assert "CIDEr" in card.text  # the measured scores stay in the card's text


def test_a_trained_card_lists_the_hub_dataset_it_was_trained_on(tmp_path):
    card = _trained_card("itune-tiny-random", tmp_path, data="yerevann/coco-karpathy")
    assert card.data.datasets == ["yerevann/coco-karpathy"]
    assert {result.dataset_type for result in card.data.eval_results} == {"yerevann/coco-karpathy"}


def test_a_trained_card_states_the_global_batch(tmp_path):
    card = _trained_card("itune-tiny-random", tmp_path, processes=4, batch_size=8, gradient_accumulation_steps=2)
    assert "| processes | 4 |" in card.text and "| global batch (captions per optimizer step) | 64 |" in card.text


def test_a_trained_card_states_each_parts_licence_and_its_own_protocol(tmp_path):
    card = _trained_card("itune-gpt2-base", tmp_path)
    assert card.data.license == "other" and card.data.license_name == "itune-hf-combined"
    licence = card.text[card.text.index("## License") : card.text.index("## Citation")]
    for part in ("the trained weights (itune_hf): apache-2.0", "openai/clip-vit-base-patch16: mit", "gpt2: mit"):
        assert part in licence, licence
    protocol = card.text[card.text.index("## Evaluation protocol") : card.text.index("## Results")]
    assert "the `val` split of `synthetic`" in protocol and "greedy decoding" in protocol
    assert "is not what was run here" in protocol and "5,000 images" not in protocol  # not the paper's protocol
    assert "Paper numbers below" not in card.text  # it has none
    same = _trained_card("itune-demo", tmp_path)  # SmolLM2 (Apache-2.0) and a tower made by the package
    assert same.data.license == "apache-2.0" and "smollm2" in same.text.lower()


def test_the_package_ships_the_licence_its_metadata_and_cards_name():
    root = Path(__file__).resolve().parents[2]
    assert "Apache License" in (root / "LICENSE").read_text() and "Version 2.0" in (root / "LICENSE").read_text()
    assert "license = Apache-2.0" in (root / "setup.cfg").read_text()
    from itune_hf.presets import get_preset, list_presets

    for name in list_presets():  # every backbone a preset uses records its licence and where it is stated
        preset = get_preset(name)
        for backbone in (preset.vision, preset.text):
            if backbone is not None:
                assert backbone.license and backbone.license_source, (name, backbone.name)

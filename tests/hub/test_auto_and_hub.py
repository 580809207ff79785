"""Auto classes, full vs adapter-only checkpoints, remote code without itune_hf, and what push_to_hub uploads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from huggingface_hub import HfApi
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

from itune_hf import ITuningConfig, ITuningForCaptioning, ITuningProcessor
from itune_hf.hub import push_captioner_to_hub, save_captioner

from conftest import run_where_itune_hf_is_not_installed, tiny_processor, write_photo


def logits(model, processor, image):
    inputs = processor(images=image, captions="a small red square")
    with torch.no_grad():
        return model(**inputs).logits


@pytest.mark.parametrize("kind", ["full", "adapter"])
def test_auto_classes_resolve_the_ituning_classes(captioner_dirs, kind, tmp_path):
    path = captioner_dirs[kind]
    assert isinstance(AutoConfig.from_pretrained(path), ITuningConfig)
    assert isinstance(AutoProcessor.from_pretrained(path), ITuningProcessor)
    model = AutoModelForImageTextToText.from_pretrained(path)
    assert type(model) is ITuningForCaptioning
    assert list(model.ituning) == ["1", "2"]  # the adapter's modules are native modules either way
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {
        n for n, _ in model.named_parameters() if n.startswith("ituning.")
    }


def test_full_and_adapter_only_checkpoints_end_in_the_same_model(captioner_dirs, tmp_path):
    image = write_photo(tmp_path / "photo.png")
    processor = tiny_processor()
    full = ITuningForCaptioning.from_pretrained(captioner_dirs["full"]).eval()
    adapter = ITuningForCaptioning.from_pretrained(captioner_dirs["adapter"]).eval()
    metadata = {"_name_or_path", "dtype", "architectures", "auto_map", "transformers_version"}
    settings = [{k: v for k, v in m.config.to_dict().items() if k not in metadata} for m in (full, adapter)]
    assert settings[0] == settings[1]
    assert torch.equal(logits(full, processor, image), logits(adapter, processor, image))
    full_state, adapter_state = full.state_dict(), adapter.state_dict()
    assert full_state.keys() == adapter_state.keys()
    assert all(torch.equal(full_state[k], adapter_state[k]) for k in full_state)


def test_adapter_only_checkpoint_holds_no_backbone_weight(captioner_dirs):
    path = captioner_dirs["adapter"]
    assert not (path / "model.safetensors").exists()
    state = load_file(path / "adapter_model.safetensors")
    assert state and all(".ituning_modules." in key for key in state)
    reference = json.loads((path / "config.json").read_text())
    assert reference["add_ituning_modules"] is False
    assert reference["vision_config"]["_name_or_path"].endswith("vision")
    assert reference["text_config"]["_name_or_path"].endswith("text")


@pytest.mark.slow
def test_full_checkpoint_loads_with_remote_code_where_itune_hf_is_not_installed(captioner_dirs, tmp_path):
    full = captioner_dirs["full"]
    assert {"configuration_ituning.py", "modeling_ituning.py", "processing_ituning.py", "settings.py"} <= {
        p.name for p in full.iterdir()
    }
    image = write_photo(tmp_path / "photo.png")
    expected = (
        ITuningForCaptioning.from_pretrained(full)
        .eval()
        .generate(**tiny_processor()(images=image), num_beams=3, max_new_tokens=6)
    )
    call = f"model.generate(**processor(images={str(image)!r}), num_beams=3, max_new_tokens=6)"
    module, ids = run_where_itune_hf_is_not_installed(full, call, tmp_path)
    assert module.startswith("transformers_modules.")  # the checkpoint's own copy of the code
    assert ids == expected.tolist()


class RecordingApi(HfApi):
    """Records what would be uploaded instead of calling the Hub."""

    def __init__(self):
        super().__init__(endpoint="http://127.0.0.1:9", token="hf_fake")
        self.repos, self.uploads, self.messages = [], [], []

    def create_repo(self, repo_id, **kwargs):
        self.repos.append(repo_id)
        return repo_id

    def upload_folder(self, *, repo_id, folder_path, **kwargs):
        files = {str(p.relative_to(folder_path)): p.read_bytes() for p in Path(folder_path).rglob("*") if p.is_file()}
        self.uploads.append((repo_id, files))
        self.messages.append(kwargs.get("commit_message"))
        return f"https://huggingface.co/{repo_id}/commit/fake"


def test_push_of_a_full_model_uploads_config_weights_processor_code_and_card(captioner_dirs):
    api = RecordingApi()
    model = ITuningForCaptioning.from_pretrained(captioner_dirs["full"])
    push_captioner_to_hub(
        model, "me/itune-tiny", processor=tiny_processor(), card="---\nlicense: mit\n---\n# card", api=api
    )
    ((repo, files),) = api.uploads
    assert repo == "me/itune-tiny" and api.repos == ["me/itune-tiny"]
    assert {
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "processor_config.json",
        "tokenizer.json",
        "README.md",
        "modeling_ituning.py",
        "configuration_ituning.py",
        "processing_ituning.py",
    } <= set(files)
    assert json.loads(files["config.json"])["auto_map"]["AutoModelForImageTextToText"].endswith("ITuningForCaptioning")


def test_push_of_an_adapter_uploads_only_adapter_files(captioner_dirs):
    from peft import PeftModel

    api = RecordingApi()
    base = ITuningForCaptioning.from_pretrained(captioner_dirs["adapter"]).eval()
    vision, text = base.config.vision_config._name_or_path, base.config.text_config._name_or_path
    bare = ITuningForCaptioning.from_vision_text_pretrained(vision, text, add_ituning_modules=False)
    adapted = PeftModel.from_pretrained(bare, captioner_dirs["adapter"])
    push_captioner_to_hub(adapted, "me/itune-adapter", processor=tiny_processor(), card="# card", api=api)
    ((_, files),) = api.uploads
    assert "adapter_model.safetensors" in files and "adapter_config.json" in files
    assert not any(name.startswith("model") and name.endswith((".safetensors", ".bin")) for name in files)
    weights = sum(len(v) for k, v in files.items() if k.endswith(".safetensors"))
    assert weights < 200_000  # I-Tuning modules only: the backbones (~2 MB here) are referenced, not copied


def test_transformers_push_to_hub_sends_the_same_files(captioner_dirs, monkeypatch):
    """`model.push_to_hub` / `processor.push_to_hub` (transformers' own) work too; the upload is intercepted."""
    uploaded = []

    def fake_create_commit(self, repo_id, operations, **kwargs):
        uploaded.extend(op.path_in_repo for op in operations)
        from huggingface_hub import CommitInfo

        return CommitInfo(
            commit_url=f"https://huggingface.co/{repo_id}/commit/0",
            commit_message="",
            commit_description="",
            oid="0" * 40,
        )

    def new_repo_has_no_card(*args, **kwargs):
        from huggingface_hub.errors import EntryNotFoundError

        raise EntryNotFoundError("new repository: no README.md yet")

    monkeypatch.setattr("huggingface_hub.ModelCard.load", new_repo_has_no_card)
    monkeypatch.setattr(HfApi, "create_commit", fake_create_commit)
    from huggingface_hub import RepoUrl

    monkeypatch.setattr(
        HfApi, "create_repo", lambda self, repo_id, **kwargs: RepoUrl(f"https://huggingface.co/{repo_id}")
    )
    model = ITuningForCaptioning.from_pretrained(captioner_dirs["full"])
    model.push_to_hub("me/itune-tiny")
    tiny_processor().push_to_hub("me/itune-tiny")
    assert {"config.json", "model.safetensors", "modeling_ituning.py", "tokenizer.json"} <= set(uploaded)


def test_save_captioner_rejects_other_models(tmp_path):
    with pytest.raises(TypeError, match="Expected a captioning model of a registered family"):
        save_captioner(torch.nn.Linear(2, 2), tmp_path)


def test_push_names_the_family_in_its_commit_and_an_unreachable_hub_in_one_error(captioner_dirs):
    from itune_hf.presets import build_model, build_processor

    api = RecordingApi()
    push_captioner_to_hub(build_model("xgpt-tiny-random"), "me/x", processor=build_processor("xgpt-tiny-random"),
                          card="# card", api=api)  # fmt: skip
    assert api.messages == ["Upload XGPT captioner"]
    model = ITuningForCaptioning.from_pretrained(captioner_dirs["full"])
    unreachable = HfApi(endpoint="http://127.0.0.1:9", token="hf_fake")  # nothing listens there: as offline
    with pytest.raises(ConnectionError, match=r"push to me/itune: the Hugging Face Hub cannot be reached.*nothing "
                       r"was uploaded\. Push again once online, or save_captioner\(model, folder\)"):  # fmt: skip
        push_captioner_to_hub(model, "me/itune", processor=tiny_processor(), card="# card", api=unreachable)


@pytest.mark.parametrize("writer", ["peft", "save_adapter", "trainer_checkpoint"])
def test_adapter_folders_over_a_preset_base_open_through_the_auto_classes_and_the_pipeline(
    writer, tmp_path, monkeypatch
):
    """Every way an adapter folder is written over a preset (whose name transformers cannot resolve) opens through
    `AutoModelForImageTextToText` and `pipeline(model=folder)`, offline, as the same model."""
    from peft import get_peft_model
    from transformers import pipeline

    from itune_hf import AdapterCheckpoints, ITuningAdapterConfig, build_model, build_processor, save_adapter

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    folder = tmp_path / "adapter"
    if writer == "peft":
        model = get_peft_model(build_model("itune-tiny-random", add_ituning_modules=False), ITuningAdapterConfig())
        for parameter in model.parameters():
            if parameter.requires_grad:
                torch.nn.init.normal_(parameter, std=0.2)
        model.save_pretrained(folder)
    else:
        model = build_model("itune-tiny-random", init="random")
        if writer == "save_adapter":
            save_adapter(model, folder)
        else:  # what Trainer's on_save leaves once AdapterCheckpoints has replaced the full weights
            model.save_pretrained(folder)
            state = type("State", (), {"global_step": 1})()
            args = type("Args", (), {"should_save": True, "output_dir": str(tmp_path)})()
            (tmp_path / "checkpoint-1").mkdir()
            model.save_pretrained(tmp_path / "checkpoint-1")
            AdapterCheckpoints().on_save(args, state, None, model=model)
            folder = tmp_path / "checkpoint-1"
    build_processor("itune-tiny-random").save_pretrained(folder)
    model.eval()
    pixels = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    expected = model.generate(pixel_values=pixels, num_beams=1, max_new_tokens=4)
    loaded = AutoModelForImageTextToText.from_pretrained(folder)
    assert type(loaded) is ITuningForCaptioning
    assert torch.equal(loaded.generate(pixel_values=pixels, num_beams=1, max_new_tokens=4), expected)
    captioner = pipeline("image-to-text", model=str(folder))
    photo = write_photo(tmp_path / "photo.png")
    assert captioner(photo, max_new_tokens=3)[0]["generated_text"] is not None
    from itune_hf.cli import main

    assert main(["caption", str(photo), "--model", str(folder), "--max-new-tokens", "3"]) == 0  # the CLI opens it too

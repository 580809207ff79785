"""FSDP's shards gathered where itune needs them whole, on CPU: torch's `fully_shard` (FSDP2) runs over a
one-process gloo group, so the parameters are DTensors as on GPUs. Accelerate gives CPU processes no FSDP
(docs/scale.md), so its `distributed_type` is set to FSDP by hand; the GPU run is `test_distributed.py`'s
`test_fsdp_on_gpus_...`."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from itune_hf.training.checkpoints import Checkpointer, TrainingState
from itune_hf.training.sharding import FSDP_OPTIMIZER_NAME, gathered_state_dict

from conftest import random_batch, tiny_model


@pytest.fixture
def fsdp(tmp_path, monkeypatch):
    """In a one-process gloo group, `prepare(*objects)`: an `Accelerator`'s `prepare` of them, after which it reports
    FSDP (Accelerate turns FSDP on for accelerator process groups only). Returns the accelerator and the objects."""
    import torch.distributed as dist
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from accelerate.utils import DistributedType

    def prepare(*objects):
        accelerator = Accelerator(cpu=True)
        prepared = [accelerator.prepare(item) for item in objects]
        monkeypatch.setattr(Accelerator, "distributed_type", property(lambda self: DistributedType.FSDP))
        return accelerator, *prepared

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'group'}", rank=0, world_size=1)
    try:
        yield prepare
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
        dist.destroy_process_group()


def shard(model, layers: tuple[str, ...]):
    """`model` sharded by `fully_shard` (its `layers` classes, then the whole): DTensor parameters, as on GPUs."""
    from torch.distributed.fsdp import fully_shard

    for module in model.modules():
        if type(module).__name__ in layers:
            fully_shard(module)
    fully_shard(model)
    assert any(type(p).__name__ == "DTensor" for p in model.parameters())
    return model


@pytest.fixture
def sharded(fsdp):
    """A tiny I-Tuning PEFT model (random backbones, random adapter) sharded, prepared with its optimizer and schedule
    by the FSDP-reporting `Accelerator`; one step taken. Yields (accelerator, prepared model, its weights before
    sharding)."""
    from peft import get_peft_model

    from itune_hf.adapter import ITuningAdapterConfig

    model = get_peft_model(tiny_model(add_ituning_modules=False), ITuningAdapterConfig(init="random"))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    shard(model, ("GPT2Block", "CLIPEncoderLayer"))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    accelerator, model, optimizer, scheduler = fsdp(model, optimizer, scheduler)
    train_step(model, optimizer, scheduler, seed=1)
    return accelerator, model, before


def train_step(model, optimizer, scheduler, seed: int) -> None:
    pixel_values, captions = random_batch(seed=seed)
    model(pixel_values=pixel_values, labels=captions).loss.backward()
    optimizer.step(), scheduler.step(), optimizer.zero_grad()


def trained(model) -> dict[str, torch.Tensor]:
    """The trainable weights of a sharded model, gathered whole (copies: one process's shards are the weights)."""
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    return {k: v.clone() for k, v in gathered_state_dict(model, names=names).items()}


def optimizer_moments(optimizer) -> list[torch.Tensor]:
    return [state["exp_avg"].full_tensor().clone() for state in optimizer.optimizer.state.values()]


def save_checkpoint(accelerator, model, tmp_path):
    """The run's Checkpointer after it saved step 1 (trainable weights only), and that checkpoint's directory."""
    checkpointer = Checkpointer(accelerator, tmp_path / "run", keep=2)
    checkpointer.save_only_trainable(model)
    checkpointer.save(TrainingState(step=1, total_steps=2))
    return checkpointer, tmp_path / "run" / "checkpoints" / "step-0000001"


def test_an_fsdp_checkpoint_holds_the_trainable_weights_whole_and_resumes_them(sharded, tmp_path):
    accelerator, model, before = sharded
    checkpointer, checkpoint = save_checkpoint(accelerator, model, tmp_path)
    files = sorted(p.name for p in checkpoint.iterdir())
    assert files == sorted([FSDP_OPTIMIZER_NAME, "manifest.json", "model.safetensors", "progress.json",
                            "random_states_0.pkl", "scheduler.bin"])  # fmt: skip
    saved, weights = load_file(checkpoint / "model.safetensors"), trained(model)
    assert set(saved) == set(weights) == checkpointer.trainable_names and all(".ituning_modules." in k for k in saved)
    assert all(torch.equal(saved[k], weights[k]) for k in saved)
    assert not any(torch.equal(saved[k], before[k]) for k in saved)  # trained
    optimizer, scheduler = accelerator._optimizers[0], accelerator._schedulers[0]
    moments, lr = optimizer_moments(optimizer), optimizer.param_groups[0]["lr"]

    train_step(model, optimizer, scheduler, seed=2)
    assert not all(torch.equal(a, b) for a, b in zip(trained(model).values(), weights.values()))
    checkpointer.resume(checkpoint)
    assert all(torch.equal(trained(model)[k], weights[k]) for k in weights)
    assert all(torch.equal(a, b) for a, b in zip(optimizer_moments(optimizer), moments))
    assert optimizer.param_groups[0]["lr"] == lr  # the schedule's state, as Accelerate loads it


def test_a_checkpoint_written_without_fsdp_is_refused_by_an_fsdp_resume_naming_it(sharded, tmp_path):
    from itune_hf.errors import InputError

    accelerator, model, _ = sharded
    checkpointer, checkpoint = save_checkpoint(accelerator, model, tmp_path)
    (checkpoint / FSDP_OPTIMIZER_NAME).rename(checkpoint / "optimizer.bin")
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    manifest["files"]["optimizer.bin"] = manifest["files"].pop(FSDP_OPTIMIZER_NAME)
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InputError, match="a run without FSDP wrote this checkpoint"):
        checkpointer.resume(checkpoint)


def save_best(accelerator, model, directory, monkeypatch) -> None:
    """`BestModel.save` of a run without validation (its card replaced: it reads the run's settings)."""
    from types import SimpleNamespace

    from itune_hf.training.validation import BestModel

    monkeypatch.setattr("itune_hf.hub.cards.training_card", lambda *args: "card")
    best = BestModel.__new__(BestModel)  # what save() reads of a run
    best.accelerator, best.processor, best.card_config, best.facts = accelerator, None, None, None
    best.config, best.datastore = SimpleNamespace(output_dir=str(directory)), None
    best.save(model, 4, None)


def test_the_adapter_saved_from_an_fsdp_run_is_gathered_whole(sharded, tmp_path, monkeypatch):
    from itune_hf.adapter.saving import within

    accelerator, model, _ = sharded
    save_best(accelerator, model, tmp_path / "out", monkeypatch)
    adapter = load_file(tmp_path / "out" / "adapter_model.safetensors")
    trainable = {k.replace(".ituning_modules.default.", ".ituning_modules."): v for k, v in trained(model).items()}
    assert set(adapter) == set(trainable) and all(torch.equal(adapter[k], trainable[k]) for k in adapter)
    text = load_file(tmp_path / "out" / "backbones" / "text" / "model.safetensors")
    expected = within(gathered_state_dict(model), "base_model.model.language_model.")
    expected = {k.replace(".base_layer.", "."): v for k, v in expected.items() if ".ituning_modules." not in k}
    assert text and all(torch.equal(t, expected[k]) for k, t in text.items())  # the random frozen LM, whole


def test_the_model_saved_from_an_fsdp_xgpt_run_is_gathered_whole(fsdp, tmp_path, monkeypatch):
    from itune_hf import build_model

    model = build_model("xgpt-tiny-random")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    accelerator, model = fsdp(shard(model, ("XGPTLayer",)))
    save_best(accelerator, model, tmp_path / "out", monkeypatch)
    saved = load_file(tmp_path / "out" / "model.safetensors")
    assert saved and all(torch.equal(t, before[k]) for k, t in saved.items())


def test_an_fsdp_xgpt_checkpoint_resumes_with_trainable_parameters_that_never_had_a_gradient(fsdp, tmp_path):
    """IDA's matching weights train only in pre-training: captioning gives them no gradient, so AdamW keeps no state
    for them, and the saved optimizer state lacks them. The GPU run (2026-11-26) stopped its resume there ("Missing
    optimizer state for parameter 'model.encoder.text.alignment_weight'")."""
    from itune_hf import build_model

    model = shard(build_model("xgpt-tiny-random"), ("XGPTLayer",))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.01)
    accelerator, model, optimizer = fsdp(model, optimizer)
    pixel_values, captions = random_batch(seed=1)
    model(pixel_values=pixel_values, labels=captions).loss.backward()
    optimizer.step(), optimizer.zero_grad()
    stateless = {n for n, p in model.named_parameters() if p.requires_grad and p not in optimizer.optimizer.state}
    assert any("alignment" in n for n in stateless)  # the case itself
    checkpointer, checkpoint = save_checkpoint(accelerator, model, tmp_path)
    moments = optimizer_moments(optimizer)
    model(pixel_values=pixel_values, labels=captions).loss.backward()
    optimizer.step(), optimizer.zero_grad()
    checkpointer.resume(checkpoint)
    assert all(torch.equal(a, b) for a, b in zip(optimizer_moments(optimizer), moments))


def test_the_summary_checksums_under_fsdp_are_the_gathered_weights(sharded):
    from itune_hf.training.accelerator import FSDP_CHECKSUMS, _checksums, _gathered_checksums

    accelerator, model, _ = sharded
    weights = trained(model)
    rows = _gathered_checksums(accelerator, model)
    assert rows.shape == (1, 3)
    assert torch.allclose(rows[0], _checksums([weights[k] for k in sorted(weights)]))
    assert "not compared" in FSDP_CHECKSUMS

"""The optimizer's groups (`itune_hf.training.accelerator.parameter_groups`): weight decay on the weights only; norm
layers, biases and the token-like learned vectors (XGPT's [MASK] and segment embeddings and encoder signals,
ClipCap's constant prefix) in a group without it, for every family's tiny model."""

from __future__ import annotations

import pytest
import torch
from accelerate.utils import DistributedType

from itune_hf.models.xgpt import XGPTConfig, XGPTForCaptioning
from itune_hf.training import TrainingConfig
from itune_hf.training.accelerator import make_optimizer, no_decay_parameter_names, parameter_groups
from itune_hf.training.model import build_training_model

from conftest import tiny_text_config, tiny_vision_config

DECAY = 0.05


def groups_by_name(model, config) -> tuple[set[str], set[str]]:
    """The names of the decayed and the not-decayed parameters of the optimizer `make_optimizer` builds."""
    optimizer = make_optimizer(config, model)
    names = {id(p): n for n, p in model.named_parameters()}
    found = {group["weight_decay"]: {names[id(p)] for p in group["params"]} for group in optimizer.param_groups}
    assert set(found) <= {DECAY, 0.0} and len(optimizer.param_groups) == len(found)
    return found.get(DECAY, set()), found.get(0.0, set())


def trainable(model) -> dict[str, torch.nn.Parameter]:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def run_config(preset: str) -> TrainingConfig:
    return TrainingConfig(output_dir="unused", preset=preset, weight_decay=DECAY)


def test_xgpt_decays_its_matrices_and_not_its_norms_biases_mask_segment_or_signals():
    config = run_config("xgpt-tiny-random")
    model = build_training_model(config).model
    decayed, kept = groups_by_name(model, config)
    params = trainable(model)
    assert decayed | kept == set(params) and not decayed & kept
    # every matrix decays (and IDA's matching weight W, a vector only because it maps to a score); nothing else does
    assert decayed == {n for n, p in params.items() if p.dim() >= 2 or n.endswith("alignment_weight")}
    special = {"segment", "mask_embedding", "memory_key_signal", "memory_value_signal", "alignment_bias"}
    assert special <= {n.rsplit(".", 1)[-1] for n in kept}
    assert any(".norm.weight" in n for n in kept) and {n for n in params if n.endswith(".bias")} <= kept


def test_xgpt_memory_type_embedding_is_not_decayed():
    xgpt = XGPTConfig(
        vision_config=tiny_vision_config().to_dict(), hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
        intermediate_size=64, vocab_size=50, grid_size=None, max_position_embeddings=16, encoder_signal="embedding",
    )  # fmt: skip
    model = XGPTForCaptioning(xgpt)
    assert "model.memory_type_embedding" in no_decay_parameter_names(model)
    assert "model.encoder.text.alignment_weight" not in no_decay_parameter_names(model)


@pytest.mark.parametrize("preset", ["itune-tiny-random", "crossattn-tiny-random", "clipcap-transformer-tiny-random"])
def test_the_other_families_decay_their_matrices_only(preset):
    config = run_config(preset)
    model = build_training_model(config).model
    decayed, kept = groups_by_name(model, config)
    params = trainable(model)
    assert decayed | kept == set(params)
    exempt_matrices = {n for n in params if n.endswith("prefix_const")}  # ClipCap's learned prefix tokens
    assert decayed == {n for n, p in params.items() if p.dim() >= 2} - exempt_matrices
    assert kept == {n for n, p in params.items() if p.dim() < 2} | exempt_matrices
    assert bool(exempt_matrices) == preset.startswith("clipcap")


def test_rms_norms_are_recognised_by_their_class_name():
    from transformers import AutoModelForCausalLM

    llama = AutoModelForCausalLM.from_config(tiny_text_config("llama"))
    exempt = no_decay_parameter_names(llama)
    norms = {n for n, _ in llama.named_parameters() if "norm" in n}
    assert norms and norms <= exempt
    assert not any(n.endswith("proj.weight") for n in exempt)


def test_an_all_exempt_model_gets_one_group():
    norm = torch.nn.LayerNorm(4)
    optimizer = make_optimizer(TrainingConfig(output_dir="unused", weight_decay=DECAY), norm)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.0]


def test_resuming_an_optimizer_state_of_other_groups_names_the_cause(tmp_path):
    from itune_hf.errors import InputError
    from itune_hf.training.checkpoints import Checkpointer

    class OneGroupCheckpoint:  # what Accelerate raises loading a one-group optimizer state into two groups
        distributed_type = DistributedType.NO
        process_index = 0

        def load_state(self, directory, strict):
            raise ValueError("loaded state dict has a different number of parameter groups")

    with pytest.raises(InputError, match="other parameter groups.*--overwrite"):
        Checkpointer(OneGroupCheckpoint(), tmp_path, keep=2).resume(tmp_path / "step-0000002")


def test_the_optimizer_is_fused_on_cpu_and_steps_as_the_default_kernel_does():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    twin = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    twin.load_state_dict(model.state_dict())
    config = TrainingConfig(output_dir="unused", weight_decay=DECAY, learning_rate=1e-2)
    fused = make_optimizer(config, model)
    assert fused.defaults["fused"] is True
    default = torch.optim.AdamW(parameter_groups(twin, DECAY), lr=1e-2, foreach=True)
    for _ in range(3):
        for net, optimizer in ((model, fused), (twin, default)):
            net(torch.ones(2, 4)).pow(2).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    for ours, theirs in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs)


def test_fsdp_keeps_the_default_optimizer_kernel():
    model = torch.nn.Linear(2, 2)
    config = TrainingConfig(output_dir="unused")
    assert make_optimizer(config, model, sharded=True).defaults["fused"] is None
    assert make_optimizer(config, model).defaults["fused"] is True

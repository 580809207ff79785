"""FSDP's sharded model, gathered where itune needs it whole: the trainable weights and the optimizer of a
checkpoint, the weights of the saved model, the summary's checksums.

Under FSDP (`accelerate launch --config_file examples/accelerate/fsdp.yaml`) each rank holds a shard of every
parameter (FSDP1: flat-parameter views; FSDP2: DTensors). Accelerate's `save_state` then writes the whole model,
frozen backbones included, through `save_fsdp_model`, and a module's `state_dict()` gives shards. Here torch's
`torch.distributed.checkpoint.state_dict` functions (FSDP1, FSDP2 and unwrapped models alike) gather them: every
function is a collective, called on every rank in the same order.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InputError

if TYPE_CHECKING:  # torch loads when a function runs: `checkpoints` imports this module
    import torch

#: The optimizer state of a checkpoint written under FSDP: gathered whole, keyed by parameter name (Accelerate's
#: `optimizer.bin` is keyed by position, and is not written under FSDP).
FSDP_OPTIMIZER_NAME = "optimizer_fsdp.bin"
WEIGHTS_NAME = "model.safetensors"


def is_fsdp(accelerator) -> bool:
    """Whether the run shards its model with FSDP (Accelerate's `DistributedType.FSDP`).

    Args:
        accelerator: The run's `Accelerator`.
    """
    return str(accelerator.distributed_type.value) == "FSDP"


def clean_name(name: str) -> str:
    """A parameter's name without the wrappers FSDP1 and activation checkpointing put in its path (the name the
    unwrapped model and the gathered state dicts use).

    Args:
        name: A name from `named_parameters()` of a (partly) wrapped model.
    """
    for wrapper in ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module."):
        name = name.replace(wrapper, "")
    return name


def gathered_state_dict(model: torch.nn.Module, *, names: set[str] | None = None) -> dict[str, torch.Tensor]:
    """The whole (unsharded) state dict of a prepared model, on CPU, on the main process (the other ranks get an
    empty dict). A collective: call it on every rank.

    Args:
        model: The prepared model (FSDP1, FSDP2, or not sharded).
        names: Keep these keys only (e.g. the trainable parameters); all keys when None.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True, broadcast_from_rank0=False)
    state = get_model_state_dict(model, options=options)
    if names is not None:
        state = {key: value for key, value in state.items() if key in names}
    return {key: value.detach().contiguous().cpu() for key, value in state.items()}


def trainable_names(model: torch.nn.Module) -> set[str]:
    """The names of the parameters of an unwrapped model that train (FSDP1's inner wrappers left out of them).

    Args:
        model: The model (`accelerator.unwrap_model` of the prepared one).
    """
    return {clean_name(n) for n, p in model.named_parameters() if p.requires_grad}


@contextlib.contextmanager
def _models_hidden(accelerator):
    """Accelerate's `save_state`/`load_state` without the model and optimizer (their FSDP writers save the whole
    model, frozen backbones included): yields them, restored afterwards."""
    models, optimizers = accelerator._models, accelerator._optimizers
    accelerator._models, accelerator._optimizers = [], []
    try:
        yield models, optimizers
    finally:
        accelerator._models, accelerator._optimizers = models, optimizers


def _indexed(name: str, index: int) -> str:
    """Accelerate's file name of the `index`-th model or optimizer (`model.safetensors`, `model_1.safetensors`)."""
    stem, dot, suffix = name.partition(".")
    return name if index == 0 else f"{stem}_{index}{dot}{suffix}"


def _torch_optimizer(optimizer):
    return getattr(optimizer, "optimizer", optimizer)  # Accelerate's AcceleratedOptimizer wraps torch's


def save_state(accelerator, directory: Path, names: set[str]) -> None:
    """`accelerator.save_state` of an FSDP run, its model's trainable weights (`names`) gathered whole into
    `model.safetensors` (as under DDP) and its optimizer's state into `optimizer_fsdp.bin`; the scheduler, the
    samplers and every rank's random states as Accelerate writes them. Call it on every rank.

    Args:
        accelerator: The run's `Accelerator` (FSDP).
        directory: The checkpoint directory (exists).
        names: The trainable parameters' names.
    """
    import torch
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    with _models_hidden(accelerator) as (models, optimizers):
        weights = [gathered_state_dict(model, names=names) for model in models]
        states = [
            get_optimizer_state_dict(models[index], _torch_optimizer(optimizer), options=options)
            for index, optimizer in enumerate(optimizers)
        ]
        accelerator.save_state(str(directory))
    if accelerator.is_main_process:
        for index, state in enumerate(weights):
            save_file(state, str(directory / _indexed(WEIGHTS_NAME, index)), metadata={"format": "pt"})
        for index, state in enumerate(states):
            torch.save(state, directory / _indexed(FSDP_OPTIMIZER_NAME, index))


def load_state(accelerator, directory: Path, **load_kwargs) -> None:
    """`accelerator.load_state` of a checkpoint `save_state` wrote: every rank reads the whole trainable weights and
    optimizer state and keeps its shards; the frozen weights stay as they are. Call it on every rank.

    Args:
        accelerator: The run's `Accelerator` (FSDP), after `prepare`.
        directory: The checkpoint directory.
        **load_kwargs: Passed to `accelerator.load_state`.

    Raises:
        InputError: the checkpoint holds no FSDP optimizer state (a run without FSDP wrote it), naming it.
    """
    import torch
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    with _models_hidden(accelerator) as (models, optimizers):
        names = [_indexed(FSDP_OPTIMIZER_NAME, index) for index in range(len(optimizers))]
        missing = [name for name in names if not (directory / name).is_file()]
        if missing:
            raise InputError(
                f"{directory} has no {', '.join(missing)}: a run without FSDP wrote this checkpoint (its optimizer "
                "state is optimizer.bin). Resume it the way it was launched, without the FSDP config"
            )
        for index, model in enumerate(models):
            weights = load_file(str(directory / _indexed(WEIGHTS_NAME, index)))
            set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True, strict=False))
        for index, optimizer in enumerate(optimizers):
            state = torch.load(directory / names[index], map_location="cpu", weights_only=True)
            # not strict: a trainable parameter that never had a gradient (XGPT's pre-training-only weights in a
            # captioning run) has no optimizer state, in the run as in its checkpoint
            options = StateDictOptions(full_state_dict=True, strict=False)
            set_optimizer_state_dict(models[index], _torch_optimizer(optimizer), state, options=options)
            _check_restored(models[index], _torch_optimizer(optimizer), state, directory / names[index])
        accelerator.load_state(str(directory), **load_kwargs)


def _check_restored(model, optimizer, state: dict, path: Path) -> None:
    """Every parameter with optimizer state in the checkpoint has it back (the load above is not strict)."""
    restored = {clean_name(name) for name, p in model.named_parameters() if p in optimizer.state}
    saved = {clean_name(name) for name in state.get("state", {})}
    if saved - restored:
        raise RuntimeError(f"{path}: the optimizer state of {sorted(saved - restored)[:5]} was not restored")


__all__ = [
    "FSDP_OPTIMIZER_NAME", "clean_name", "gathered_state_dict", "is_fsdp", "load_state", "save_state",
    "trainable_names",
]  # fmt: skip

"""The run's machinery around the loop: the `Accelerator` (precision, DDP settings), optimizer and schedule, the
recorded settings, the summary and the run's end."""

from __future__ import annotations

import dataclasses
import gc
import os
import time
import warnings
import weakref
from pathlib import Path
from typing import Any

import torch

from ..utils.files import atomic_write_json
from .checkpoints import TrainingState
from .config import TrainingConfig
from .model import training_family
from .peers import join_restarted_group, record_launch
from .sharding import gathered_state_dict, is_fsdp, trainable_names


def make_accelerator(config: TrainingConfig):
    """The run's `Accelerator`, with its mixed precision and a line describing it (see `_choose_runtime`)."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs, ProjectConfiguration, TorchDynamoPlugin

    output_dir = Path(config.output_dir)
    precision, runtime_note = _choose_runtime(config)
    # Under DDP every trainable parameter must get a gradient in every backward unless DDP is told to look for the
    # unused ones. XGPT's encoder-text parameters serve only the pre-training tasks (plain captioning leaves them
    # unused), and each pre-training task leaves others unused (TIFG: the region embedding; IC: the text ones).
    unused = config.pretraining or training_family(config).unused_parameters
    # --torch-compile; else Accelerate's own choice: the launcher's --dynamo_backend (ACCELERATE_DYNAMO_BACKEND)
    backend = "INDUCTOR" if config.torch_compile else os.environ.get("ACCELERATE_DYNAMO_BACKEND", "NO").upper()
    _forget_earlier_choices(precision, backend)
    _fsdp_needs_an_accelerator()
    accelerator = Accelerator(
        dynamo_plugin=TorchDynamoPlugin(backend="inductor", dynamic=True) if config.torch_compile else None,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        # the schedule counts optimizer steps (`_update` steps it after each): by default Accelerate would step it once
        # per process, and a 2-process run would warm up in half its steps and decay twice as fast
        step_scheduler_with_optimizer=False,
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=unused)],
        mixed_precision=precision,
        log_with=None if config.report_to == "none" else config.report_to,
        project_config=ProjectConfiguration(project_dir=str(output_dir), logging_dir=str(output_dir / "logs")),
    )
    return accelerator, precision, runtime_note


def _forget_earlier_choices(precision: str, dynamo_backend: str) -> None:
    """Let a run choose its mixed precision and compilation (`dynamo_backend`, e.g. "NO" or "INDUCTOR") in a process
    where an earlier run (a `Trainer`, another `train()`, a notebook cell) chose others: Accelerate keeps those choices
    process-wide, refusing another precision ("restart your runtime") and silently keeping the earlier compilation.
    A single process starts Accelerate's state afresh (its device and process group are kept); a launched
    multi-process run keeps Accelerate's refusal, which names the flag."""
    from accelerate.state import AcceleratorState, PartialState

    state = AcceleratorState._shared_state
    if state == PartialState._shared_state or PartialState._shared_state.get("num_processes", 1) != 1:
        return  # no run chose yet, or a launched run: Accelerate's own rules
    plugin = state.get("dynamo_plugin")
    earlier_backend = str(getattr(plugin.backend, "value", plugin.backend)).upper() if plugin is not None else "NO"
    earlier_precision = state.get("_mixed_precision")
    if (earlier_precision is not None and earlier_precision != precision) or earlier_backend != dynamo_backend:
        AcceleratorState._reset_state(reset_partial_state=False)


def _fsdp_needs_an_accelerator() -> None:
    """An FSDP launch (`accelerate launch --config_file examples/accelerate/fsdp.yaml`) on CPU processes trains with
    DDP over gloo, and says so once. Accelerate (1.15) turns FSDP on only for accelerator process groups
    (`AcceleratorState`: CUDA, XPU, NPU, ...): on CPU it left the run DDP without a word, or, with the config's
    `fsdp_sync_module_states`, refused with "There are currently no available devices found". torch's `fully_shard`
    itself runs on gloo; Accelerate does not hand it CPU processes."""
    import os
    import sys

    from accelerate.utils import parse_flag_from_env

    if not parse_flag_from_env("ACCELERATE_USE_FSDP") or launch_device().type != "cpu":
        return
    os.environ["ACCELERATE_USE_FSDP"] = "false"
    from accelerate import PartialState, __version__

    if PartialState().is_main_process:
        print(
            f"warning: FSDP was asked for (accelerate launch's FSDP config), but Accelerate {__version__} shards "
            "with FSDP on accelerators only (CUDA, XPU, ...): these CPU processes train with DDP over gloo, each "
            "holding the whole model (train_summary.json: distributed_type MULTI_CPU)",
            file=sys.stderr,
        )


def fit_fsdp_wrapping(accelerator, model) -> list[str] | None:
    """Under FSDP's transformer-based wrapping, wrap the layer classes that `model` has: those the config names
    (`fsdp_transformer_layer_cls_to_wrap`) when it has them all, else those of its `_no_split_modules` it has.
    Accelerate refuses a named class the model lacks ("Could not find the transformer layer class ... in the
    model"), and a composite model's `_no_split_modules` names classes of its backbones' whole families (I-Tuning's
    CLIP vision tower lists `CLIPTextEmbeddings`), so one config could not serve I-Tuning on GPT-2 and on SmolLM2,
    and XGPT. Returns the classes wrapped, or None when the run is not FSDP with that policy.

    Args:
        accelerator: The run's `Accelerator` (before `prepare`).
        model: The model about to be prepared.
    """
    plugin = getattr(accelerator.state, "fsdp_plugin", None)
    if plugin is None or str(accelerator.distributed_type.value) != "FSDP":
        return None
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    if plugin.auto_wrap_policy is not transformer_auto_wrap_policy:
        return None
    present = {type(module).__name__ for module in model.modules()}
    own = sorted(getattr(model, "_no_split_modules", None) or [])
    asked = list(plugin.transformer_cls_names_to_wrap or [])
    kept = asked if asked and set(asked) <= present else [name for name in own if name in present]
    if set(kept) != set(asked):
        accelerator.print(f"FSDP: wrapping {', '.join(kept) or 'the whole model as one unit'} (this model's layer "
                          f"classes; the config named {', '.join(asked) or 'none'})")  # fmt: skip
    plugin.transformer_cls_names_to_wrap = kept
    return kept


#: The torch normalisation layers whose parameters are never decayed (other classes named `...Norm`, e.g. Llama's
#: `LlamaRMSNorm`, are recognised by their name).
NORM_LAYERS = (torch.nn.LayerNorm, torch.nn.GroupNorm, torch.nn.modules.batchnorm._NormBase)


def _is_norm(module: torch.nn.Module) -> bool:
    return isinstance(module, NORM_LAYERS) or type(module).__name__.endswith("Norm")


def no_decay_parameter_names(model: torch.nn.Module) -> set[str]:
    """The names (as `model.named_parameters()` gives them) of the parameters weight decay leaves alone.

    The transformers convention (norm layers and biases) plus the learned vectors a module names in its class
    attribute `_no_weight_decay` (XGPT's [MASK] and segment embeddings and its encoder signals, ClipCap's constant
    prefix): decay would pull these towards zero, which for a scale (a norm's weight), an offset (a bias) or a vector
    that stands for a token is a prior on the wrong thing, not a regulariser.

    Args:
        model: The model the optimizer trains.
    """
    names = set()
    for module_name, module in model.named_modules():
        exempt, norm = set(getattr(module, "_no_weight_decay", ())), _is_norm(module)
        for name, _ in module.named_parameters(recurse=False):
            if norm or name == "bias" or name.endswith("_bias") or name in exempt:
                names.add(f"{module_name}.{name}" if module_name else name)
    return names


def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """What trains in `model` as the optimizer's two groups: `weight_decay` on the weights, none on the parameters of
    `no_decay_parameter_names` (an empty group is left out).

    Args:
        model: The model the optimizer trains (only the parameters that require grad are taken).
        weight_decay: The decoupled weight decay of the first group.
    """
    exempt = no_decay_parameter_names(model)
    decayed, kept = [], []
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            (kept if name in exempt else decayed).append(parameter)
    groups = [{"params": decayed, "weight_decay": weight_decay}, {"params": kept, "weight_decay": 0.0}]
    return [group for group in groups if group["params"]]


def make_optimizer(config: TrainingConfig, model, *, sharded: bool = False) -> torch.optim.Optimizer:
    """AdamW over what trains, with the run's learning rate, weight decay and betas; norm layers, biases and the
    token-like learned vectors are not decayed (`parameter_groups`).

    XGPT (section 5.4) trains with Adam (beta1 0.9, beta2 0.98), which is AdamW with `--weight-decay 0`; the default
    0.01 on the weights only is the transformers convention, kept for every family (the recipes set the betas).

    Args:
        config: The run's settings (learning rate, weight decay, betas).
        model: The model, before `accelerator.prepare`.
        sharded: The run shards the model with FSDP (`sharding.is_fsdp`): the default kernel, not the fused one.
    """
    betas = (config.adam_beta1, config.adam_beta2)
    groups = parameter_groups(model, config.weight_decay)
    fused = fused_optimizer_fits(groups, sharded=sharded)
    return torch.optim.AdamW(
        groups, lr=config.learning_rate, weight_decay=config.weight_decay, betas=betas, fused=fused or None
    )


def fused_optimizer_fits(groups: list[dict[str, Any]], *, sharded: bool = False) -> bool:
    """Whether AdamW's fused kernel (one pass over all parameters) can take the run's: float tensors on a CPU or CUDA
    device, outside FSDP (`sharded`: its sharded parameters keep the default, per-tensor-list kernel). The fused
    optimizer step is several times faster, which counts most for a model that trains many parameters (XGPT's
    embedding); benchmarks/records/optimizer-cpu.json, `benchmarks/bench_optimizer.py`."""
    if sharded:
        return False
    parameters = [p for group in groups for p in group["params"]]
    return all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in parameters)


def make_scheduler(config: TrainingConfig, optimizer, total_steps: int):
    from transformers import get_scheduler

    schedule = "constant_with_warmup" if config.lr_schedule == "constant" else config.lr_schedule
    return get_scheduler(schedule, optimizer, num_warmup_steps=config.warmup_steps, num_training_steps=total_steps)


def stretch_scheduler(scheduler, config: TrainingConfig, total_steps: int) -> None:
    """Give a running schedule (`make_scheduler`'s, maybe wrapped by Accelerate) a new length: from the step it has
    reached on, its learning rates are those of `make_scheduler(config, ..., total_steps)`. Stretched after the
    warm-up, a run takes the steps a run planned with that length from the start takes (the warm-up does not depend
    on the length)."""
    inner = getattr(scheduler, "scheduler", scheduler)
    probe = torch.optim.SGD([{"params": [torch.zeros(1, requires_grad=True)]} for _ in inner.base_lrs], lr=1.0)
    inner.lr_lambdas = make_scheduler(config, probe, total_steps).lr_lambdas
    for group, base, factor in zip(inner.optimizer.param_groups, inner.base_lrs, inner.lr_lambdas, strict=True):
        group["lr"] = base * factor(inner.last_epoch)
    inner._last_lr = [group["lr"] for group in inner.optimizer.param_groups]  # what get_last_lr() reports


def record_settings(config: TrainingConfig, accelerator) -> None:
    """Write `training_config.json` and which launch runs it (`peers.record_launch`) from the main process, and
    start the trackers with the settings."""
    output_dir = Path(config.output_dir)
    if accelerator.is_main_process:
        output_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(output_dir / "training_config.json", dataclasses.asdict(config))
        record_launch(output_dir)
    accelerator.wait_for_everyone()
    if config.report_to != "none":
        accelerator.init_trackers(
            "itune",
            config={
                k: v if isinstance(v, (int, float, str, bool)) else str(v)
                for k, v in dataclasses.asdict(config).items()
            },
        )


def run_summary(
    accelerator,
    model,
    state: TrainingState,
    *,
    precision: str,
    runtime_note: str,
    trainable: int,
    train_captions: int,
    epochs: float,
    started: float,
) -> dict[str, Any]:
    """The run's results (`train_summary.json`): length, settings, losses and scores, every rank's adapter checksums
    (under FSDP, where each rank holds shards, one row: the gathered weights'; `checksums_of` says which)."""
    checksums = _gathered_checksums(accelerator, model) if is_fsdp(accelerator) else _rank_checksums(accelerator, model)
    return {
        "steps": state.step,
        "mixed_precision": precision,
        "runtime": runtime_note,
        "epochs": epochs,
        "captions_seen": state.captions_seen,
        "trainable_parameters": trainable,
        "train_captions": train_captions,
        "processes": accelerator.num_processes,
        "distributed_type": str(accelerator.distributed_type.value),
        "best_step": state.best_step,
        "best_val_CIDEr": state.best_metric,
        "final_loss": next((h["loss"] for h in reversed(state.history) if "loss" in h), None),
        "history": state.history,
        "seconds": round(time.time() - started, 1),
        "rank_adapter_checksums": checksums.cpu().tolist(),
        "ranks_identical": None if is_fsdp(accelerator) else bool((checksums == checksums[0]).all()),
        **({"checksums_of": FSDP_CHECKSUMS} if is_fsdp(accelerator) else {}),
    }


#: What `rank_adapter_checksums` holds under FSDP (`train_summary.json`'s `checksums_of`).
FSDP_CHECKSUMS = (
    "the trainable weights gathered from the FSDP shards, once (each rank holds other shards of them: ranks are not "
    "compared, ranks_identical is null)"
)


def _rank_checksums(accelerator, model) -> torch.Tensor:
    """Three checksums of each rank's trainable weights, one row per rank: DDP must have kept the rows equal."""
    weights = [p for n, p in sorted(accelerator.unwrap_model(model).named_parameters()) if p.requires_grad]
    mine = _checksums(weights)
    return accelerator.gather(mine.unsqueeze(0).to(accelerator.device))


def _gathered_checksums(accelerator, model) -> torch.Tensor:
    """`_rank_checksums` under FSDP: the checksums of the trainable weights gathered whole (by every rank; the main
    process computes them and shares them), one row."""
    from accelerate.utils import broadcast

    names = trainable_names(accelerator.unwrap_model(model))
    weights = gathered_state_dict(model, names=names)  # on the main process; empty elsewhere
    mine = _checksums([weights[name] for name in sorted(weights)]) if weights else torch.zeros(3)
    return broadcast(mine.unsqueeze(0).to(accelerator.device), from_process=0)


def _checksums(weights: list[torch.Tensor]) -> torch.Tensor:
    """The sum, the sum of absolute values and the position-weighted sum of `weights`, flattened in order."""
    flat = torch.cat([p.detach().flatten().float() for p in weights])
    positions = torch.arange(len(flat), device=flat.device, dtype=flat.dtype)  # on the weights' device (CUDA)
    return torch.stack([flat.sum(), flat.abs().sum(), (flat * positions).sum()])


def end_training(accelerator, prepared_model: weakref.ref) -> None:
    """End the run (trackers, process group) once the prepared model is freed; the caller has dropped its references."""
    # Free the DDP wrapper *before* end_training() destroys the process group. Once the group is destroyed, the DDP
    # reducer is its last owner, and freeing the reducer (from Python, GIL held) joins gloo worker threads that may be
    # waiting for the GIL to drop a finished collective's tensors: a hang at exit (seen ~1 run in 3 on 2 CPU cores;
    # pytorch/pytorch#56297). Freed while the group lives, the reducer only drops a reference; the group itself is
    # destroyed through torch's GIL-releasing destructor.
    accelerator.free_memory()
    gc.collect()  # a wrapper kept alive by a reference cycle would otherwise be freed later, at a random point
    if prepared_model() is not None:
        warnings.warn(
            "itune_hf: the prepared (DDP) model is still referenced after training; process-group teardown may hang",
            RuntimeWarning,
            stacklevel=3,
        )
    accelerator.end_training()


def _choose_runtime(config: TrainingConfig) -> tuple[str, str]:
    """The run's mixed precision and a line describing it and the CPU settings (see `itune_hf.utils.runtime`)."""
    from ..utils.runtime import configure_cpu_runtime, resolve_mixed_precision

    device = launch_device()
    requested, launcher = launcher_precision(config.mixed_precision)
    precision, reason = resolve_mixed_precision(requested, str(device))
    note = f"mixed precision {precision} ({launcher or reason})"
    if device.type == "cpu":
        note += f"; {configure_cpu_runtime().describe()}"
    return precision, note


def launcher_precision(requested: str) -> tuple[str, str | None]:
    """The precision to resolve: `accelerate launch`'s (`--mixed_precision`, or its config's), which it hands on as
    `ACCELERATE_MIXED_PRECISION`, where the run's `--mixed-precision` is `auto` (the default: no choice made);
    otherwise the run's. Returns it and, when it is the launcher's, the reason for the log.

    Args:
        requested: The run's `mixed_precision`.

    Raises:
        ValueError: the launcher chose a precision itune does not train in (e.g. fp8), naming it.
    """
    import os

    from ..utils.runtime import MIXED_PRECISION

    launched = os.environ.get("ACCELERATE_MIXED_PRECISION", "").strip().lower()
    if requested != "auto" or not launched:
        return requested, None
    if launched not in MIXED_PRECISION:
        raise ValueError(
            f"accelerate launch --mixed_precision {launched} (ACCELERATE_MIXED_PRECISION): itune trains in "
            f"{', '.join(p for p in MIXED_PRECISION if p != 'auto')}; launch with one of them"
        )
    return launched, f"accelerate launch's --mixed_precision {launched} (or its config's): the launcher's choice"


def launch_device():
    """The device this process trains on, known before the `Accelerator` exists (its precision depends on it).

    Creates Accelerate's shared process state the way `Accelerator()` would, honouring `ACCELERATE_USE_CPU` (without
    it, a CPU run under `accelerate launch --multi_gpu` would become independent single processes).
    """
    from accelerate import PartialState
    from accelerate.utils import parse_flag_from_env

    cpu = parse_flag_from_env("ACCELERATE_USE_CPU")
    join_restarted_group(cpu)  # an elastic restart's process group, on keys of its own
    return PartialState(cpu=cpu).device

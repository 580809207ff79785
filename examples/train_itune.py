"""Train a captioner with Accelerate, in one readable file: an I-Tuning adapter, or an XGPT model.

This is the bare training loop; `itune train` adds checkpoints, `--resume`, validation with best-checkpoint selection,
trackers and a model card on top of the same pieces. Run it on one CPU, one GPU or many:

    python examples/train_itune.py --data synthetic --preset itune-tiny-random --max-steps 20 \
        --output-dir outputs/example
    python examples/train_itune.py --data synthetic --preset xgpt-tiny-random --max-steps 20 --output-dir outputs/xgpt
    accelerate launch --config_file examples/accelerate/multi_gpu.yaml examples/train_itune.py --data ... --preset ...
"""

from __future__ import annotations

import argparse

import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import set_seed
from peft import get_peft_model
from torch.utils.data import DataLoader
from transformers import get_scheduler

from itune_hf import ITuningAdapterConfig, build_model, build_processor, get_preset
from itune_hf.data import load_captions
from itune_hf.hub import save_captioner
from itune_hf.training import CaptionCollator, CaptionPairs, EpochPermutation, launch_device
from itune_hf.utils.runtime import MIXED_PRECISION, resolve_mixed_precision


def get_dataloader(args, processor) -> DataLoader:
    """(image, caption) pairs of the training split, in a seeded order, tokenised by the processor."""
    pairs = CaptionPairs(load_captions(args.data, args.image_root)["train"])
    return DataLoader(
        pairs,
        batch_size=args.batch_size,
        sampler=EpochPermutation(len(pairs), args.seed),
        collate_fn=CaptionCollator(processor),  # pixels in; with a feature cache, vision states
        generator=torch.Generator().manual_seed(args.seed),
    )


def build_trainable(preset: str):
    """The model to train: only what should learn requires grad."""
    if get_preset(preset).family.saves == "full":  # XGPT: the whole Transformer trains, the vision tower is frozen
        return build_model(preset, pretrained=True)
    base = build_model(preset, pretrained=True, add_ituning_modules=False)  # I-Tuning: both backbones frozen
    # I-Tuning modules in parallel to the LM's feed-forward blocks, from the preset's first layer (Dropping).
    return get_peft_model(base, ITuningAdapterConfig(first_layer=base.config.first_layer))


def training_function(args) -> None:
    # auto: bf16 only where the device computes it natively (emulated bf16 is many times slower than fp32)
    precision, reason = resolve_mixed_precision(args.mixed_precision, str(launch_device()))
    accelerator = Accelerator(mixed_precision=precision)
    accelerator.print(f"mixed precision {precision} ({reason})")
    set_seed(args.seed)
    with accelerator.main_process_first():  # the main process converts/caches backbones and data first
        model = build_trainable(args.preset)
        processor = build_processor(args.preset)
        loader = get_dataloader(args, processor)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    accelerator.print(f"{trainable:,} trainable parameters")

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.learning_rate)
    scheduler = get_scheduler(
        "cosine", optimizer, num_warmup_steps=args.max_steps // 10, num_training_steps=args.max_steps
    )
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

    model.train()
    step, epoch = 0, 0
    while step < args.max_steps:
        loader.set_epoch(epoch)  # a new order every epoch, the same on every process
        for batch in loader:
            loss = model(**batch).loss  # caption LM loss; the vision tower runs without autograd
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            step += 1
            if step % 10 == 0:
                accelerator.print(f"step {step}: loss {loss.item():.3f}")
            if step == args.max_steps:
                break
        epoch += 1

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:  # adapter-only files (I-Tuning) or the full model (XGPT) + the processor
        save_captioner(accelerator.unwrap_model(model), args.output_dir, processor=processor)
        accelerator.print(f"saved to {args.output_dir} (itune caption/eval load it)")
    # Free the DDP wrapper, then the process group, before Python exits (a gloo group freed last can hang there).
    del model
    accelerator.free_memory()
    PartialState().destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="synthetic", help="Karpathy JSON, built-in name or HF dataset.")
    parser.add_argument("--image-root", default=None)
    parser.add_argument("--preset", default="itune-demo", help="Family, backbones, settings (itune params --list).")
    parser.add_argument("--output-dir", default="outputs/example")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--max-steps", type=int, default=200)
    parser.add_argument("--mixed-precision", default="auto", choices=MIXED_PRECISION)
    parser.add_argument("--seed", type=int, default=0)
    training_function(parser.parse_args())


if __name__ == "__main__":
    main()

"""Per-step figures at the papers' sizes, for the paper-scale plan (docs/scale.md): training steps, feature caching,
captioning, memory, checkpoint sizes and the matmul-peak fraction, on one device (random weights).

Workloads (`--workloads`, comma-separated):

    itune-features    I-Tuning on GPT-2 large (itune-gpt2-large, modules in all 36 layers) as `itune train` builds
                      it (PEFT adapter on the frozen base), on cached vision states (`itune train --feature-cache`)
    itune-images      the same from pixels: the frozen CLIP ViT-B/16 runs (without autograd) inside the step
    itune-drop        I-Tuning Dropping on GPT-2 large (itune-gpt2-large-drop18), cached states
    xgpt-features     XGPT Base (xgpt-base, trained whole but the frozen tower), cached states, the IC objective
    tower             the frozen CLIP ViT-B/16 alone: images/s of `itune cache-features`
    caption           captions/s of I-Tuning large (beam 5, the paper's) and XGPT Base (beam 2, the paper's)

Training steps: AdamW on the trainable parameters, real backward, training mode, `--caption-tokens` tokens per caption.
`--precision bf16` runs the step under bf16 autocast with fp32 weights, as `itune train --mixed-precision bf16` does.
Each workload: `--warmup` untimed steps, then `--steps` timed steps (device synchronised around each); the median is
reported. FLOPs per step are counted once with `torch.utils.flop_counter` (matrix products and attention), and the
achieved rate is compared with the measured dense bf16 (or fp32) matrix-product peak of the same device. Peak memory
is the CUDA allocator's high-water mark over the workload (on CPU: not measured). Checkpoint sizes are the bytes that
`save_pretrained` writes (PEFT: the adapter only) plus AdamW's two fp32 moments per trainable parameter.

    python benchmarks/bench_scale.py --device cuda --precision bf16 --json scale.json
    python benchmarks/bench_scale.py --tiny --steps 1 --warmup 0        # smoke run: figures meaningless
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
from pathlib import Path

import _common as common
import torch

WORKLOADS = ("itune-features", "itune-images", "itune-drop", "xgpt-features", "tower", "caption")
PRESETS = {"itune": "itune-gpt2-large", "itune-drop": "itune-gpt2-large-drop18", "xgpt": "xgpt-base"}
TINY_PRESETS = {"itune": "itune-tiny-random", "itune-drop": "itune-tiny-random", "xgpt": "xgpt-tiny-random"}


# ------------------------------------------------------------------------------------------------ models
def build(kind: str, tiny: bool, device: torch.device):
    """(model, vocabulary size, frozen vision tower): I-Tuning as a PEFT adapter on the bare base, as `itune train`
    builds it; XGPT whole."""
    from itune_hf import build_model

    preset = (TINY_PRESETS if tiny else PRESETS)[kind]
    torch.manual_seed(0)
    if kind.startswith("itune"):
        from peft import get_peft_model

        from itune_hf import ITuningAdapterConfig

        base = build_model(preset, add_ituning_modules=False)
        model = get_peft_model(base, ITuningAdapterConfig(first_layer=base.config.first_layer))
        return model.to(device), base.config.text_config.vocab_size, base.vision_model
    model = build_model(preset)
    return model.to(device), model.config.vocab_size, model.vision_model


def autocast(args, device: torch.device):
    enabled = args.precision == "bf16"
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled)


def images(vision, batch: int, device: torch.device) -> torch.Tensor:
    size = vision.config.image_size
    return torch.randn(batch, 3, size, size, device=device)


def step_inputs(workload: str, model, vision, vocab: int, args, device: torch.device) -> dict:
    pixels = images(vision, args.batch_size, device)
    labels = torch.randint(0, vocab, (args.batch_size, args.caption_tokens), device=device)
    if workload == "itune-images":
        return {"pixel_values": pixels, "labels": labels}
    with torch.no_grad(), autocast(args, device):
        states = vision(pixel_values=pixels).last_hidden_state.float()
    key = "vision_hidden_states" if workload.startswith("xgpt") else "encoder_outputs"
    return {key: states, "labels": labels}


# ------------------------------------------------------------------------------------------------ measurements
def count_flops(function) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        function()
    return counter.get_total_flops()


def time_steps(function, args, device: torch.device) -> list[float]:
    for _ in range(args.warmup):
        function()
    return [common.timed(function, device) for _ in range(args.steps)]


def checkpoint_bytes(model, trainable: int) -> dict[str, int]:
    with tempfile.TemporaryDirectory() as directory:
        model.save_pretrained(directory)
        saved = sum(f.stat().st_size for f in Path(directory).rglob("*") if f.is_file())
    return {"save_pretrained_bytes": saved, "adamw_state_bytes": 2 * 4 * trainable}


def training_workload(workload: str, args, device: torch.device) -> dict:
    kind = "itune-drop" if workload == "itune-drop" else workload.split("-")[0]
    model, vocab, vision = build(kind, args.tiny, device)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-4)
    inputs = step_inputs(workload, model, vision, vocab, args, device)

    def step():
        with autocast(args, device):
            loss = model(**inputs).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # AdamW's state exists before the memory high-water mark is read
    flops = count_flops(step)
    seconds = time_steps(step, args, device)
    n_trainable = sum(p.numel() for p in trainable)
    return {
        "workload": workload, "preset": (TINY_PRESETS if args.tiny else PRESETS)[kind],
        "batch": args.batch_size, "caption_tokens": args.caption_tokens,
        "trainable_parameters": n_trainable, "total_parameters": sum(p.numel() for p in model.parameters()),
        "ms_per_step": 1000 * common.median(seconds), "steps_ms": [round(1000 * s, 2) for s in seconds],
        "captions_per_s": args.batch_size / common.median(seconds), "flops_per_step": flops,
        **checkpoint_bytes(model, n_trainable),
    }  # fmt: skip


def tower_workload(args, device: torch.device) -> dict:
    _, _, vision = build("itune", args.tiny, device)
    pixels = images(vision, args.batch_size, device)

    def forward():
        with torch.inference_mode(), autocast(args, device):
            vision(pixel_values=pixels)

    flops = count_flops(forward)
    seconds = time_steps(forward, args, device)
    states = vision.config.hidden_size * ((vision.config.image_size // vision.config.patch_size) ** 2 + 1)
    return {
        "workload": "tower", "batch": args.batch_size, "ms_per_step": 1000 * common.median(seconds),
        "images_per_s": args.batch_size / common.median(seconds), "flops_per_step": flops,
        "cached_bytes_per_image_fp16": 2 * states, "cached_bytes_per_image_fp32": 4 * states,
    }  # fmt: skip


def caption_workload(args, device: torch.device) -> dict:
    rows = {}
    for kind, beams in (("itune", 5), ("xgpt", 2)):
        model, _, vision = build(kind, args.tiny, device)
        model.eval()
        pixels = images(vision, args.caption_batch, device)

        def generate(m=model, x=pixels, k=beams):
            with torch.inference_mode(), autocast(args, device):
                m.generate(pixel_values=x, num_beams=k, do_sample=False, min_new_tokens=args.caption_tokens,
                           max_new_tokens=args.caption_tokens)  # fmt: skip

        seconds = time_steps(generate, args, device)
        rows[kind] = {
            "beams": beams,
            "batch": args.caption_batch,
            "captions_per_s": args.caption_batch / common.median(seconds),
        }
        del model
        release(device)
    return {"workload": "caption", "rows": rows}


def release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_workload(workload: str, args, device: torch.device) -> dict:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    if workload == "tower":
        row = tower_workload(args, device)
    elif workload == "caption":
        row = caption_workload(args, device)
    else:
        row = training_workload(workload, args, device)
    row["peak_memory_bytes"] = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    release(device)
    return row


def matmul_peak(args, device: torch.device) -> float:
    """Dense matrix-product TFLOP/s at the workloads' precision (bf16 or fp32), the median of a few products."""
    size = 256 if args.tiny else 8192
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    return common.median([2 * size**3 / common.timed(lambda: a @ b, device) for _ in range(5)]) / 1e12


# ------------------------------------------------------------------------------------------------ report
def print_rows(rows: list[dict], peak: float, args) -> None:
    print(f"\ndense {args.precision} matrix-product peak: {peak:.1f} TFLOP/s")
    print("\n| workload | batch | trainable | ms/step | captions/s | TFLOP/s (share of peak) | peak memory (GB) | "
          "saved (MB) | + AdamW state (MB) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        memory = "-" if row["peak_memory_bytes"] is None else f"{row['peak_memory_bytes'] / 1e9:.2f}"
        if row["workload"] == "caption":
            for kind, c in row["rows"].items():
                print(f"| caption: {kind}, beam {c['beams']} | {c['batch']} | - | - | {c['captions_per_s']:.1f} | "
                      f"- | {memory} | - | - |")  # fmt: skip
            continue
        rate = row["flops_per_step"] / (row["ms_per_step"] / 1000) / 1e12
        per_s = row.get("captions_per_s", row.get("images_per_s"))
        saved = f"{row['save_pretrained_bytes'] / 1e6:.1f}" if "save_pretrained_bytes" in row else "-"
        state = f"{row['adamw_state_bytes'] / 1e6:.1f}" if "adamw_state_bytes" in row else "-"
        trainable = f"{row['trainable_parameters']:,}" if "trainable_parameters" in row else "-"
        print(f"| {row['workload']} | {row['batch']} | {trainable} | {row['ms_per_step']:.1f} | {per_s:.1f} | "
              f"{rate:.1f} ({rate / peak:.0%}) | {memory} | {saved} | {state} |")  # fmt: skip


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="bf16: autocast, fp32 weights")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated of {', '.join(WORKLOADS)}")
    parser.add_argument("--batch-size", type=int, default=64, help="captions (or images) per training/tower step")
    parser.add_argument("--caption-batch", type=int, default=32, help="images per generate call")
    parser.add_argument("--caption-tokens", type=int, default=common.CAPTION_LENGTH)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per workload")
    parser.add_argument("--tiny", action="store_true", help="tiny random presets (smoke run; figures meaningless)")
    parser.add_argument("--threads", type=int, help="CPU threads for torch (default: one per core)")
    parser.add_argument("--json", metavar="OUT", help="also write every measurement to this JSON file")
    args = parser.parse_args(argv)
    common.apply_threads(args)
    workloads = [w for w in args.workloads.split(",") if w]
    unknown = sorted(set(workloads) - set(WORKLOADS))
    if unknown:
        parser.error(f"--workloads: unknown {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
    device = torch.device(args.device)
    info = common.machine(device)
    common.print_machine(info)
    peak = matmul_peak(args, device)
    rows = []
    for workload in workloads:
        rows.append(run_workload(workload, args, device))
        print(f"  {workload}: done", flush=True)
    print_rows(rows, peak, args)
    common.write_json(args.json, {"machine": info, "arguments": vars(args), "matmul_peak_tflops": peak, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())

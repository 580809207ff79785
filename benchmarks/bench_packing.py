"""Padding-free caption batches: the I-Tuning training step on padded batches against packed ones (and against
length-grouped batches, `--group-by-length`), on the captions of the demo's synthetic world.

    python benchmarks/bench_packing.py                       # the demo's model: SmolLM2-135M, modules in 15..29
    python benchmarks/bench_packing.py --json benchmarks/records/packing-cpu.json

Arms (one model, random vision states in place of a tower, AdamW on the modules, training mode):

    padded           random batches (the training order's), padded to their longest caption: the baseline
    packed           the same batches, packed (`itune_hf.models.ituning.packing`)
    grouped-padded   batches of similar length (`--group-by-length`), padded
    grouped-packed   the same, packed

Time: each round takes the round's next batch of both orders and times one step of every arm in turn, so that a change
of load hits every arm alike; each arm's ratio to `padded` is taken within a round and the median over rounds is
reported, with the real and padded tokens the batches held.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

import _common as common
import torch

ARMS = ("padded", "packed", "grouped-padded", "grouped-packed")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="itune-demo-resnet", help="Model preset (default: the demo's).")
    parser.add_argument("--images", type=int, default=400, help="Images of the synthetic world (5 captions each).")
    common.add_round_arguments(parser, batch_size=32)
    return parser.parse_args(argv)


def caption_orders(preset: str, images: int, batch_size: int):
    """The world's captions, the processor, and the first epoch's batches in random and length-grouped order."""
    from itune_hf import build_processor
    from itune_hf.data import load_captions, make_synthetic
    from itune_hf.training import EpochPermutation, LengthGroupedPermutation
    from itune_hf.training.data import caption_lengths

    with tempfile.TemporaryDirectory() as root:
        make_synthetic(root, num_images=images, seed=0, image_size=32)
        captions = [c for cs in load_captions(f"{root}/dataset.json")["train"]["captions"] for c in cs]
    processor = build_processor(preset)
    order = list(EpochPermutation(len(captions), seed=0))
    grouped = LengthGroupedPermutation(caption_lengths(processor, captions), batch_size, seed=0).batches()
    random_batches = [order[k : k + batch_size] for k in range(0, len(order) - batch_size + 1, batch_size)]
    return captions, processor, {"padded": random_batches, "grouped": [b for b in grouped if len(b) == batch_size]}


def main(argv=None) -> int:
    args = parse_args(argv)
    common.apply_threads(args)
    from itune_hf import build_model

    preset = "itune-tiny-random" if args.tiny else args.preset
    captions, processor, orders = caption_orders(preset, args.images, args.batch_size)
    torch.manual_seed(0)
    model = build_model(preset, pretrained=not args.tiny).train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    with torch.no_grad():  # the shape of the tower's states (random ones stand in for a feature cache)
        states_shape = model.encode_images(processor(images=[blank_image()])["pixel_values"]).last_hidden_state.shape
    rows = {arm: [] for arm in ARMS}
    tokens = {arm: [0, 0] for arm in ARMS}  # real, in the LM's rows

    def step(batch_indices, packs: bool, arm: str) -> float:
        batch = dict(processor(captions=[captions[i] for i in batch_indices]))
        batch["encoder_outputs"] = torch.randn(len(batch_indices), *states_shape[1:])
        model._packing_checked = packs
        mask = batch["decoder_attention_mask"]
        tokens[arm][0] += int(mask.sum())
        tokens[arm][1] += packed_slots(mask) if packs else mask.numel()
        started = time.perf_counter()
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - started

    for warm in range(2):  # warm-up: allocator, threads, the packing probe
        model._packing_checked = None
        step(orders["padded"][warm], None, "padded")
    tokens = {arm: [0, 0] for arm in ARMS}
    for round_ in range(args.rounds):
        for arm in ARMS:
            order = orders["grouped" if arm.startswith("grouped") else "padded"]
            rows[arm].append(step(order[2 + round_], arm.endswith("packed"), arm))
        print(f"round {round_}: " + ", ".join(f"{arm} {1000 * rows[arm][-1]:.0f} ms" for arm in ARMS), flush=True)
    report = summarise(args, preset, rows, tokens)
    print_report(report)
    common.write_json(args.json, report)
    return 0


def packed_slots(mask: torch.Tensor) -> int:
    from itune_hf.models.ituning.packing import PackedCaptions

    packing = PackedCaptions.of(mask)
    return packing.rows * packing.capacity


def blank_image():
    from PIL import Image

    return Image.new("RGB", (64, 64))


def summarise(args, preset: str, rows: dict, tokens: dict) -> dict:
    baseline = rows["padded"]
    return {
        "what": "I-Tuning training step (forward, backward, AdamW) on the demo world's captions: padded vs packed "
        "batches, random vs length-grouped order; ratio = padded ms / arm ms within a round, median over rounds",
        "command": "python benchmarks/bench_packing.py " + " ".join(sys.argv[1:]),
        "machine": common.machine(torch.device("cpu")),
        "preset": preset,
        "batch_size": args.batch_size,
        "rounds": args.rounds,
        "arms": {
            arm: {
                "ms_per_step": round(1000 * common.median(times), 1),
                "speedup_vs_padded": round(statistics.median(b / t for b, t in zip(baseline, times)), 3),
                "real_tokens_per_step": round(tokens[arm][0] / len(times), 1),
                "lm_tokens_per_step": round(tokens[arm][1] / len(times), 1),
            }
            for arm, times in rows.items()
        },
    }


def print_report(report: dict) -> None:
    common.print_machine(report["machine"])
    print(f"{'arm':16} {'ms/step':>9} {'vs padded':>10} {'real tok':>9} {'LM tok':>8}")
    for arm, row in report["arms"].items():
        print(
            f"{arm:16} {row['ms_per_step']:9.0f} {row['speedup_vs_padded']:9.2f}x "
            f"{row['real_tokens_per_step']:9.0f} {row['lm_tokens_per_step']:8.0f}"
        )


if __name__ == "__main__":
    raise SystemExit(main())

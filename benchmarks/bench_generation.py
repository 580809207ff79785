"""Caption generation: I-Tuning (modules in every layer, and with dropping of the lower half) against
VisionEncoderDecoderModel, in captions per second.

Each measurement is one whole captioning call from raw pixels: `model.generate(pixel_values=...)`, which runs the
vision tower once per image and decodes exactly 20 new tokens per caption (min_new_tokens = max_new_tokens = 20, so
no caption stops early at EOS), with greedy search or beam search (5 beams), for batches of 1 and 16 images. The
three models share the backbone configs (CLIP ViT-B/16 tower, GPT-2; random weights) and live in one process; every
run times each model once per setting, in turn, and the ratios are taken within a run (median over runs reported).

    python benchmarks/bench_generation.py                     # GPT-2 base, 3 runs
    python benchmarks/bench_generation.py --lm gpt2-large --repeats 2
    python benchmarks/bench_generation.py --beams 5 --kv-per-beam  # + the beam-copy baseline (see below)

`--kv-per-beam` adds a fourth model: I-Tuning as it decoded before the visual keys/values were shared by the beams
of an image, i.e. projecting them from generate()'s beam-expanded vision states (5 identical copies per image) and
attending per beam. The outputs are the same (tests/models/test_modeling.py checks it); only the work differs.
"""

from __future__ import annotations

import argparse
import functools
import sys

import _common as common
import torch

MODELS = {
    "itune": "I-Tuning",
    "itune_drop": "I-Tuning, dropping lower half",
    "ved": "VisionEncoderDecoderModel",
    "itune_kv_per_beam": "I-Tuning, visual K/V per beam copy",
}


def kv_per_beam(model):
    """Make `model` project the visual keys/values from the beam-expanded states, as before they were shared."""
    context = model.vision_context
    context.require_distinct_states = lambda where: (context.require_states(where), 1)
    return model


def build_models(args, device: torch.device) -> dict:
    models = {
        "itune": common.build_ituning(args.lm, args.tiny, drop=False),
        "itune_drop": common.build_ituning(args.lm, args.tiny, drop=True),
        "ved": common.build_ved(args.lm, args.tiny),
    }
    if args.kv_per_beam:
        models["itune_kv_per_beam"] = kv_per_beam(common.build_ituning(args.lm, args.tiny, drop=False))
    return {name: model.to(device).eval() for name, model in models.items()}


def caption(model, pixel_values: torch.Tensor, beams: int, new_tokens: int) -> torch.Tensor:
    with torch.inference_mode():
        sequences = model.generate(
            pixel_values=pixel_values,
            num_beams=beams,
            do_sample=False,
            min_new_tokens=new_tokens,
            max_new_tokens=new_tokens,
        )
    if sequences.shape != (pixel_values.shape[0], new_tokens + 1):  # the start token and the new tokens
        raise RuntimeError(f"{type(model).__name__} generated {tuple(sequences.shape)} tokens")
    return sequences


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_common_arguments(parser, repeats=3)
    parser.add_argument("--batch-sizes", default="1,16", help="comma-separated images per generate call")
    parser.add_argument("--beams", default="1,5", help="comma-separated beam counts (1 = greedy)")
    parser.add_argument("--new-tokens", type=int, default=common.CAPTION_LENGTH)
    parser.add_argument(
        "--kv-per-beam", action="store_true", help="also time I-Tuning projecting visual K/V per beam copy (baseline)"
    )
    args = parser.parse_args()
    common.apply_threads(args)
    device = torch.device(args.device)
    settings = [(int(b), int(n)) for n in args.batch_sizes.split(",") for b in args.beams.split(",")]

    info = common.machine(device)
    models = build_models(args, device)
    runs = time_settings(models, settings, args, device)
    rows = [summarise(runs, beams, batch, models, args) for beams, batch in settings]
    print()
    common.print_machine(info)
    print(
        f"model: {common.preset_name(args.lm, args.tiny)} backbones; {args.new_tokens} new tokens per caption, "
        f"whole generate() call from pixels; {args.repeats} runs"
    )
    print_tables(rows, args)
    common.write_json(args.json, {"machine": info, "arguments": vars(args), "runs": runs, "rows": rows})
    return 0


def time_settings(models: dict, settings: list[tuple[int, int]], args, device: torch.device) -> list[dict]:
    """One row per (run, setting, model): every model captions each setting's batch once per run, in rotating
    order, after one warm-up call per beam count."""
    generator = torch.Generator().manual_seed(0)
    shape = common.image_shape(args.lm, args.tiny)
    images = {n: torch.randn(n, *shape, generator=generator).to(device) for _, n in settings}
    for model in models.values():  # warm-up: thread pools, allocations, generation-config plumbing
        for beams in sorted({b for b, _ in settings}):
            caption(model, images[min(images)], beams, args.new_tokens)
    runs = []
    for repeat in range(args.repeats):
        for beams, batch in settings:
            order = list(models)
            order = order[repeat % len(order) :] + order[: repeat % len(order)]  # rotate who goes first
            for name in order:
                call = functools.partial(caption, models[name], images[batch], beams, args.new_tokens)
                seconds = common.timed(call, device)
                runs.append(
                    {"repeat": repeat, "beams": beams, "batch": batch, "model": name, "seconds": seconds,
                     "captions_per_s": batch / seconds}
                )  # fmt: skip
                print(f"  run {repeat + 1} beams {beams} batch {batch} {name}: {batch / seconds:.2f} captions/s",
                      flush=True)  # fmt: skip
    return runs


def summarise(runs: list[dict], beams: int, batch: int, models: dict, args) -> dict:
    """One setting's medians: captions/s per model and the ratios, each the median of its per-run ratios."""
    cell = [r for r in runs if r["beams"] == beams and r["batch"] == batch]
    rate = {m: common.median([r["captions_per_s"] for r in cell if r["model"] == m]) for m in models}
    per_run = {k: {r["model"]: r["captions_per_s"] for r in cell if r["repeat"] == k} for k in range(args.repeats)}
    ratio = {m: common.median([run[m] / run["ved"] for run in per_run.values()]) for m in ("itune", "itune_drop")}
    drop_vs_full = common.median([run["itune_drop"] / run["itune"] for run in per_run.values()])
    row = {"beams": beams, "batch": batch, "captions_per_s": rate, "vs_ved": ratio, "drop_vs_itune": drop_vs_full,
           "runs": {m: [round(r["captions_per_s"], 3) for r in cell if r["model"] == m] for m in models}}  # fmt: skip
    if args.kv_per_beam:
        row["shared_vs_per_beam"] = common.median([run["itune"] / run["itune_kv_per_beam"] for run in per_run.values()])
    row["met"] = ratio["itune"] >= 1.0 and ratio["itune_drop"] > 1.0
    return row


def print_tables(rows: list[dict], args) -> None:
    """The results table, the K/V-per-beam table (with `--kv-per-beam`) and the individual runs."""
    print()
    print("| decoding | batch | VED captions/s | I-Tuning captions/s | I-Tuning dropping captions/s | I-Tuning / VED | "
          "dropping / VED | dropping / I-Tuning | target |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        rate, ratio = row["captions_per_s"], row["vs_ved"]
        decoding = "greedy" if row["beams"] == 1 else f"beam {row['beams']}"
        print(
            f"| {decoding} | {row['batch']} | {rate['ved']:.2f} | {rate['itune']:.2f} | {rate['itune_drop']:.2f} | "
            f"{ratio['itune']:.2f}x | {ratio['itune_drop']:.2f}x | {row['drop_vs_itune']:.2f}x | "
            f"{'met' if row['met'] else 'missed'} |"
        )
    print()
    print("target: I-Tuning at least as fast as VED (ratio >= 1.00) and I-Tuning with dropping faster (> 1.00)")
    if args.kv_per_beam:
        print()
        print("| decoding | batch | K/V per beam copy captions/s | K/V shared by the beams captions/s | "
              "shared / per copy |")  # fmt: skip
        print("|---|---|---|---|---|")
        for row in rows:
            rate = row["captions_per_s"]
            decoding = "greedy" if row["beams"] == 1 else f"beam {row['beams']}"
            print(
                f"| {decoding} | {row['batch']} | {rate['itune_kv_per_beam']:.2f} | {rate['itune']:.2f} | "
                f"{row['shared_vs_per_beam']:.2f}x |"
            )
    print("individual runs (captions/s):")
    for row in rows:
        print(f"  beams {row['beams']} batch {row['batch']}: " + "; ".join(
            f"{MODELS[m]} {' / '.join(f'{x:.2f}' for x in xs)}" for m, xs in row["runs"].items()))  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())

"""The decoding paths of `itune_hf.inference.decoding` on one device, in captions per second: transformers' default
path, `auto` (what `itune caption` and the pipeline take: the default path on a CPU, the fast path on a CUDA GPU)
and `fast` (a static cache and a compiled decode step), with each path's first call (where the fast path compiles)
and whether its captions equal the default path's. Two ablations, each the fast path with one part as in an earlier
version (the rest as now): `fast-reproject`, whose compiled steps project I-Tuning's visual keys/values again at every
step (it runs after `fast`, so its first call recompiles rather than compiling from nothing), and `fast-unpooled`,
which gives every greedy call a new static cache and new key/value tensors (on a GPU, CUDA graphs record again
whenever those addresses change; on a CPU, nothing replays graphs and it should equal `fast`).

Each call captions a batch from raw pixels with the inputs `itune caption` passes (pixels, the start token and its
mask of ones), exactly `--new-tokens` new tokens (min = max, so no caption stops early), greedy or beam search. The
model is I-Tuning over `--lm` with random weights, its modules too (at their default zero output projection the
modules add nothing, and equal captions would not show that a step read the right visual keys/values). Within a repeat
the paths run in turn and each ratio is against the default path of the same repeat (median over repeats).

    python benchmarks/bench_decoding.py --threads 1 --json benchmarks/records/decoding-cpu.json
    python benchmarks/bench_decoding.py --device cuda --lm gpt2-large --settings 1x1,16x1,16x5,128x5
"""

from __future__ import annotations

import argparse
import functools
import time
from contextlib import contextmanager, nullcontext

import _common as common
import torch

from itune_hf.inference import decoding
from itune_hf.inference.decoding import fast_generate

PATHS = ("default", "auto", "fast", "fast-reproject", "fast-unpooled")


@contextmanager
def reprojecting():
    """The fast path's first version (the ablation `fast-reproject`): its compiled steps project I-Tuning's visual
    keys/values again at every step instead of reading those the eager prefill projected."""
    from itune_hf.models.ituning.modeling_ituning import ITuningForCaptioning

    original = ITuningForCaptioning._reuse_projections_in_trace

    def without_reuse(self):
        modules = original(self)
        for module in modules:
            module.reuse_in_trace = False
        return modules

    ITuningForCaptioning._reuse_projections_in_trace = without_reuse
    try:
        yield
    finally:
        ITuningForCaptioning._reuse_projections_in_trace = original


@contextmanager
def unpooled():
    """The fast path before its static inputs were pooled (the ablation `fast-unpooled`): each greedy call builds a
    new static cache and projects the visual keys/values into new tensors."""
    original = decoding._static_inputs
    decoding._static_inputs = lambda captioner: nullcontext()
    try:
        yield
    finally:
        decoding._static_inputs = original


ABLATIONS = {"fast-reproject": reprojecting, "fast-unpooled": unpooled}


def parse_settings(text: str) -> list[tuple[int, int]]:
    """`"1x1,8x5"` -> `[(1, 1), (8, 5)]`: batch size x beams."""
    settings = []
    for item in text.split(","):
        batch, _, beams = item.partition("x")
        settings.append((int(batch), int(beams)))
    return settings


def caption_inputs(model, batch: int, device: torch.device) -> dict:
    """What `itune caption` passes for `batch` images: pixels, the start token, its mask (ones)."""
    size = model.config.vision_config.image_size
    generator = torch.Generator().manual_seed(batch)
    start = model.generation_config.decoder_start_token_id
    return {
        "pixel_values": torch.randn(batch, 3, size, size, generator=generator).to(device),
        "decoder_input_ids": torch.full((batch, 1), start, dtype=torch.long, device=device),
        "decoder_attention_mask": torch.ones(batch, 1, dtype=torch.long, device=device),
    }


def call(model, path: str, inputs: dict, beams: int, new_tokens: int) -> torch.Tensor:
    with torch.inference_mode(), ABLATIONS.get(path, nullcontext)():
        return fast_generate(model, path.partition("-")[0], **inputs, num_beams=beams, do_sample=False,
                             min_new_tokens=new_tokens, max_new_tokens=new_tokens)  # fmt: skip


def measure(model, setting: tuple[int, int], args, device: torch.device) -> dict:
    """One batch x beams setting: every path's first call and repeats, ratios to the default path per repeat."""
    batch, beams = setting
    inputs = caption_inputs(model, batch, device)
    rows, captions = {}, {}
    for path in PATHS:
        start = time.perf_counter()
        captions[path] = call(model, path, inputs, beams, args.new_tokens)
        common.synchronize(device)
        rows[path] = {
            "resolved": decoding.resolve_decoding(model, path.partition("-")[0]),
            "first_call_s": time.perf_counter() - start,
            "captions_equal_default": torch.equal(captions[path], captions["default"]),
            "seconds": [],
        }
        call(model, path, inputs, beams, args.new_tokens)  # CUDA graphs record on the first calls after compiling
    for _ in range(args.repeats):
        for path in PATHS:
            timed = functools.partial(call, model, path, inputs, beams, args.new_tokens)
            rows[path]["seconds"].append(common.timed(timed, device))
    for row in rows.values():
        row["median_s"] = common.median(row["seconds"])
        row["captions_per_s"] = batch / row["median_s"]
        ratios = [d / s for d, s in zip(rows["default"]["seconds"], row["seconds"])]
        row["speedup_over_default"] = common.median(ratios)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_common_arguments(parser, repeats=3)
    parser.add_argument("--settings", default="1x1,8x5", help="batch x beams, comma-separated (default 1x1,8x5)")
    parser.add_argument("--new-tokens", type=int, default=common.CAPTION_LENGTH)
    parser.add_argument("--backend", default="inductor", help="torch.compile's backend on the fast path")
    args = parser.parse_args(argv)
    common.apply_threads(args)
    decoding.BACKEND = args.backend
    device = torch.device(args.device)
    info = common.machine(device)
    common.print_machine(info)
    from itune_hf.presets import build_model

    torch.manual_seed(0)  # modules initialised at random: at their default (zero output) no caption reads them
    model = build_model(common.preset_name(args.lm, args.tiny), init="random").to(device).eval()
    payload = {"machine": info, "arguments": vars(args), "preset": common.preset_name(args.lm, args.tiny)}
    for setting in parse_settings(args.settings):
        key = f"batch_{setting[0]}:beam_{setting[1]}"
        payload[key] = measure(model, setting, args, device)
        for path, row in payload[key].items():
            print(f"{key:>16} {path:>14} ({row['resolved']:>7}): first call {row['first_call_s']:7.2f} s, "
                  f"{row['captions_per_s']:7.2f} captions/s, {row['speedup_over_default']:.2f}x default, "
                  f"captions equal: {row['captions_equal_default']}", flush=True)  # fmt: skip
    common.write_json(args.json, payload)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

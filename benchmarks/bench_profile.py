"""Where the time goes: achieved FLOP/s of the I-Tuning training step and of decoding against a measured matmul
peak, and the top operators by self CPU time.

    python benchmarks/bench_profile.py                   # GPT-2 base + CLIP ViT-B/16, 3 runs
    python benchmarks/bench_profile.py --lm gpt2-large

1. Peak: a 4096 x 4096 fp32 matrix product on this machine (GFLOP/s, median of the runs).
2. Training step (d) of bench_training.py: I-Tuning in every layer on cached vision states, batch 8 x 20 tokens,
   AdamW, real backward. The step's FLOPs are counted once with torch.utils.flop_counter.FlopCounterMode (matrix
   products and attention only: element-wise work is not counted, so the fraction is a lower bound of the busy
   time), its time is the median of the timed steps; achieved GFLOP/s = FLOPs / time.
3. Decoding: `generate()` on precomputed vision states (the vision tower excluded, so this is the decoder alone),
   exactly 20 new tokens, greedy with batch 1 and beam 5 with batch 16; the same FLOP count over time.
4. A torch.profiler trace of one training step and one decoding call: the operators with the most self CPU time,
   and the time outside any operator (Python, hooks, generation logic: wall time minus the operators' self times).
"""

from __future__ import annotations

import argparse
import sys

import _common as common
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers.modeling_outputs import BaseModelOutput

TOP_OPERATORS = 12


def count_flops(function) -> int:
    with FlopCounterMode(display=False) as counter:
        function()
    return counter.get_total_flops()


def profile(function, device: torch.device, top: int) -> dict:
    """Top operators by self time of one call of `function`, and the share of the wall time outside operators."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profiler:
        wall = common.timed(function, device)
    averages = profiler.key_averages()
    total_self_us = sum(event.self_cpu_time_total for event in averages)
    events = sorted(averages, key=lambda event: event.self_cpu_time_total, reverse=True)[:top]
    return {
        "wall_ms": 1000 * wall,
        "operators_self_ms": total_self_us / 1000,
        "outside_operators_ms": 1000 * wall - total_self_us / 1000,
        "top": [
            {
                "operator": event.key,
                "self_cpu_ms": event.self_cpu_time_total / 1000,
                "share_of_self_time": event.self_cpu_time_total / total_self_us,
                "calls": event.count,
            }
            for event in events
        ],
    }


def training_case(args, device: torch.device):
    """Step function of variant (d), ready to run (model built, cached vision states computed)."""
    model = common.build_ituning(args.lm, args.tiny, drop=False).to(device).train()
    generator = torch.Generator().manual_seed(0)
    pixel_values = torch.randn(args.batch_size, *common.image_shape(args.lm, args.tiny), generator=generator)
    vocab = model.config.text_config.vocab_size
    ids = torch.randint(0, vocab, (args.batch_size, common.CAPTION_LENGTH + 1), generator=generator).to(device)
    with torch.no_grad():
        states = model.vision_model(pixel_values=pixel_values.to(device)).last_hidden_state
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)

    def step():
        model(encoder_outputs=states, decoder_input_ids=ids[:, :-1], labels=ids[:, 1:]).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return model, step


def decoding_case(model, args, device: torch.device, beams: int, batch: int):
    """generate() on precomputed vision states: the decoder alone, exactly CAPTION_LENGTH new tokens."""
    generator = torch.Generator().manual_seed(0)
    states = torch.randn(batch, *common.vision_states_shape(args.lm, args.tiny), generator=generator).to(device)

    def decode():
        with torch.inference_mode():
            model.generate(
                # A fresh wrapper per call: generate() expands encoder_outputs for the beams in place (it would grow
                # 5x on every call if the same BaseModelOutput were passed again).
                encoder_outputs=BaseModelOutput(last_hidden_state=states),
                num_beams=beams,
                do_sample=False,
                min_new_tokens=common.CAPTION_LENGTH,
                max_new_tokens=common.CAPTION_LENGTH,
            )

    return decode


def measure(name: str, function, device: torch.device, args, peak: float) -> dict:
    function()  # warm-up
    flops = count_flops(function)
    seconds = [common.timed(function, device) for _ in range(args.repeats)]
    achieved = flops / common.median(seconds) / 1e9
    result = {
        "case": name,
        "gflop": flops / 1e9,
        "ms": [1000 * s for s in seconds],
        "median_ms": 1000 * common.median(seconds),
        "achieved_gflops": achieved,
        "fraction_of_peak": achieved / peak,
    }
    print(f"  {name}: {result['gflop']:.1f} GFLOP, {result['median_ms']:.0f} ms, {achieved:.1f} GFLOP/s", flush=True)
    return result


def print_profile(title: str, result: dict) -> None:
    print()
    print(
        f"{title}: wall {result['wall_ms']:.0f} ms under the profiler, operators' self time "
        f"{result['operators_self_ms']:.0f} ms, outside operators {result['outside_operators_ms']:.0f} ms "
        f"({result['outside_operators_ms'] / result['wall_ms']:.0%})"
    )
    print()
    print("| operator | self CPU ms | share of operator time | calls |")
    print("|---|---|---|---|")
    for row in result["top"]:
        print(f"| `{row['operator']}` | {row['self_cpu_ms']:.1f} | {row['share_of_self_time']:.1%} | {row['calls']} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_common_arguments(parser, repeats=3)
    parser.add_argument("--batch-size", type=int, default=8, help="images per training step")
    parser.add_argument("--matmul-size", type=int, default=4096, help="side of the square matrices of the peak")
    parser.add_argument("--decode-batch", type=int, default=16, help="images per beam-search decoding call")
    args = parser.parse_args()
    common.apply_threads(args)
    device = torch.device(args.device)
    info = common.machine(device)

    peak, peak_runs = common.matmul_peak_gflops(device, args.matmul_size, max(args.repeats, 3))
    print(f"  matmul peak: {peak:.1f} GFLOP/s ({' / '.join(f'{x:.1f}' for x in peak_runs)})", flush=True)
    model, step = training_case(args, device)
    cases = [measure(f"training step (d), batch {args.batch_size}", step, device, args, peak)]
    model.eval()
    decoders = {}
    for beams, batch in ((1, 1), (5, args.decode_batch)):
        decoders[(beams, batch)] = decoding_case(model, args, device, beams, batch)
        label = "greedy" if beams == 1 else f"beam {beams}"
        cases.append(measure(f"decoding, {label}, batch {batch}", decoders[(beams, batch)], device, args, peak))
    model.train()
    profiles = {"training step (d)": profile(step, device, TOP_OPERATORS)}
    model.eval()
    for (beams, batch), decode in decoders.items():
        label = "greedy" if beams == 1 else f"beam {beams}"
        profiles[f"decoding, {label}, batch {batch}"] = profile(decode, device, TOP_OPERATORS)

    print()
    common.print_machine(info)
    print(f"model: {common.preset_name(args.lm, args.tiny)}, I-Tuning in every layer; {args.repeats} timed runs")
    print()
    print(f"matmul peak ({args.matmul_size}^2 fp32 GEMM): {peak:.1f} GFLOP/s (runs: "
          f"{' / '.join(f'{x:.1f}' for x in peak_runs)})")  # fmt: skip
    print()
    print("| case | GFLOP (counted) | median ms | achieved GFLOP/s | fraction of matmul peak |")
    print("|---|---|---|---|---|")
    for case in cases:
        print(
            f"| {case['case']} | {case['gflop']:.1f} | {case['median_ms']:.0f} | {case['achieved_gflops']:.1f} | "
            f"{case['fraction_of_peak']:.0%} |"
        )
    for title, result in profiles.items():
        print_profile(title, result)
    common.write_json(
        args.json,
        {"machine": info, "arguments": vars(args), "matmul_peak_gflops": peak, "matmul_peak_runs": peak_runs,
         "cases": cases, "profiles": profiles},
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

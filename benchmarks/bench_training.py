"""Training step: I-Tuning against VisionEncoderDecoderModel (ms/step, peak memory, trainable parameters).

Variants (same CLIP ViT-B/16 tower and GPT-2 configs, random weights, AdamW on the trainable parameters, real
backward, dropout as configured, training mode):

    a  VisionEncoderDecoderModel (CLIP vision tower + GPT-2 with add_cross_attention), everything trained
    b  the same with both backbones frozen: only the cross-attention blocks (and their layer norms) trained
    c  I-Tuning on raw images (the frozen vision tower runs without autograd inside the step)
    d  I-Tuning on cached features (precomputed vision last hidden states passed as encoder_outputs)
    e  (d) with I-Tuning Dropping of the lower half of the LM (no modules, no backward in those layers)
    A-E  the same, the model's forward through `torch.compile` (inductor; its backward compiled with it); e.g.
         `--variants bdBD` gives (b)/(d) eager and compiled, and each compiled variant's speed-up over its eager form

    python benchmarks/bench_training.py                      # GPT-2 base, batch 8 x 20 tokens, 5 rounds
    python benchmarks/bench_training.py --lm gpt2-large --variants de --batch-size 4

Time: the variants live in one process and take their steps in turn (a b c d e, b c d e a, ...; one timed step each
per round, after the warm-up steps), so that a change of load on the (shared) machine hits every variant alike; each
ratio is taken within a round, and the median over rounds is reported.

Memory: each variant then runs alone in a fresh Python process (warm-up steps plus one step). Peak memory on CPU is
that process's resident-set high-water mark (VmHWM, reset through /proc/self/clear_refs once the model, inputs and
cached features are built) minus its resident set before the model was built: weights, gradients, optimizer state
and activations. On CUDA it is torch.cuda.max_memory_allocated.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import _common as common
import torch

VARIANTS = {
    "a": "VED, full fine-tuning",
    "b": "VED, backbones frozen, cross-attention trained",
    "c": "I-Tuning, raw images",
    "d": "I-Tuning, cached features",
    "e": "I-Tuning, cached features, dropping lower half",
}
VARIANTS.update({v.upper(): f"{description}, torch.compile" for v, description in list(VARIANTS.items())})
# (numerator, denominator, minimum speed-up) and the memory bound of the issue.
SPEED_TARGETS = [("d", "b", 3.0), ("d", "a", 5.0), ("e", "d", 1.3), ("D", "B", 5.0)]  # issue 31 item 4: 5x
MEMORY_TARGET = ("d", "a", 0.3)


# ------------------------------------------------------------------------------------------------ memory (CPU)
def _status_kib(field: str) -> int | None:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return None


def reset_cpu_peak() -> bool:
    """Reset the resident-set high-water mark to the current resident set (Linux `clear_refs` 5)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


# ------------------------------------------------------------------------------------------------ one variant
def build(variant: str, args, device: torch.device):
    """The model of a variant, and its training step (AdamW on the trainable parameters) ready to call."""
    compiled, variant = variant.isupper(), variant.lower()
    batch, length = args.batch_size, common.CAPTION_LENGTH
    generator = torch.Generator().manual_seed(0)
    if variant in "ab":
        model = common.build_ved(args.lm, args.tiny)
        if variant == "b":
            common.freeze_ved_backbones(model)
        vocab = model.config.decoder.vocab_size
    else:
        model = common.build_ituning(args.lm, args.tiny, drop=variant == "e")
        vocab = model.config.text_config.vocab_size
    model.to(device).train()
    pixel_values = torch.randn(batch, *common.image_shape(args.lm, args.tiny), generator=generator).to(device)
    ids = torch.randint(0, vocab, (batch, length + 1), generator=generator).to(device)
    inputs = {"decoder_input_ids": ids[:, :-1], "labels": ids[:, 1:]}
    if variant in "de":
        # The feature cache stores the tower's last hidden states; here they are computed once, before timing.
        with torch.no_grad():
            inputs["encoder_outputs"] = model.vision_model(pixel_values=pixel_values).last_hidden_state
    else:
        inputs["pixel_values"] = pixel_values
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    forward = torch.compile(model) if compiled else model  # compiled on its first call (a warm-up step)

    def step():
        forward(**inputs).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return model, step


def memory_worker(args) -> dict:
    """Peak memory of one variant alone in this (fresh) process: warm-up steps plus one step."""
    device = torch.device(args.device)
    rss_before = _status_kib("VmRSS")
    model, step = build(args.worker, args, device)
    rss_built = _status_kib("VmRSS")
    peak_reset = reset_cpu_peak() if device.type == "cpu" else True
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        built = torch.cuda.memory_allocated(device)
    seconds = [common.timed(step, device) for _ in range(args.warmup + 1)]
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
    else:
        peak, built = (_status_kib("VmHWM") - rss_before) * 1024, (rss_built - rss_before) * 1024
    return {
        "variant": args.worker,
        "peak_bytes": peak,
        "after_build_bytes": built,
        "peak_reset": peak_reset,
        "alone_ms": [1000 * s for s in seconds],
    }


def time_interleaved(variants: str, args, device: torch.device) -> tuple[list[dict], dict]:
    """All variants in this process, one timed step each per round, in rotating order."""
    models, steps = {}, {}
    for v in variants:
        models[v], steps[v] = build(v, args, device)
        print(f"  built ({v})", flush=True)
    for v in variants:
        for _ in range(args.warmup):
            steps[v]()
    runs = []
    for round_ in range(args.repeats):
        order = variants[round_ % len(variants) :] + variants[: round_ % len(variants)]
        for v in order:
            runs.append({"variant": v, "round": round_, "ms": 1000 * common.timed(steps[v], device)})
        print(f"  round {round_ + 1}: " + ", ".join(f"({r['variant']}) {r['ms']:.0f} ms" for r in runs[-len(order) :]),
              flush=True)  # fmt: skip
    params = {
        v: {"trainable": common.trainable_parameters(m), "total": sum(p.numel() for p in m.parameters())}
        for v, m in models.items()
    }
    return runs, params


def count_step_flops(variants: str, args, device: torch.device) -> dict[str, float]:
    """GFLOP of one training step per variant (torch's flop counter: matrix products and attention), after one
    untimed step: a count, so it does not depend on the machine's load."""
    from torch.utils.flop_counter import FlopCounterMode

    counts = {}
    for v in variants:
        model, step = build(v, args, device)
        step()
        counter = FlopCounterMode(display=False)
        with counter:
            step()
        counts[v] = counter.get_total_flops() / 1e9
        print(f"  ({v}) {VARIANTS[v]}: {counts[v]:.1f} GFLOP per step", flush=True)
        del model, step
    return counts


# ------------------------------------------------------------------------------------------------ report
def summarise(runs: list[dict], params: dict, memory: dict, variants: str) -> dict:
    rounds = max(r["round"] for r in runs) + 1
    per_round = [{r["variant"]: r["ms"] for r in runs if r["round"] == k} for k in range(rounds)]

    def speedup(fast: str, slow: str) -> float | None:
        if fast not in variants or slow not in variants:
            return None
        return common.median([ms[slow] / ms[fast] for ms in per_round])

    def gigabytes(v: str, key: str) -> float | None:
        return memory[v][key] / 1e9 if v in memory else None

    rows = {
        v: {
            "description": VARIANTS[v],
            "trainable_params": params[v]["trainable"],
            "total_params": params[v]["total"],
            "median_ms": common.median([ms[v] for ms in per_round]),
            "rounds_ms": [round(ms[v], 1) for ms in per_round],
            "peak_gb": gigabytes(v, "peak_bytes"),
            "after_build_gb": gigabytes(v, "after_build_bytes"),
            "speedup_vs_a": speedup(v, "a"),
            "speedup_vs_b": speedup(v, "b"),
            "speedup_vs_eager": speedup(v, v.lower()) if v.isupper() else None,
        }
        for v in variants
    }
    targets = []
    for fast, slow, minimum in SPEED_TARGETS:
        value = speedup(fast, slow)
        if value is not None:
            targets.append(
                {"target": f"({fast}) >= {minimum}x faster than ({slow})", "measured": f"{value:.2f}x",
                 "met": value >= minimum}
            )  # fmt: skip
    small, large, maximum = MEMORY_TARGET
    if small in memory and large in memory:
        value = memory[small]["peak_bytes"] / memory[large]["peak_bytes"]
        targets.append(
            {"target": f"peak memory of ({small}) <= {maximum}x of ({large})", "measured": f"{value:.2f}x",
             "met": value <= maximum}
        )  # fmt: skip
    return {"rows": rows, "targets": targets}


def print_report(summary: dict, args, info: dict) -> None:
    def fmt(value, pattern, suffix=""):
        return "-" if value is None else format(value, pattern) + suffix

    print()
    common.print_machine(info)
    print(
        f"model: {common.preset_name(args.lm, args.tiny)} backbones; batch {args.batch_size} images x "
        f"{common.CAPTION_LENGTH} caption tokens; {args.warmup} warm-up step(s), then {args.repeats} rounds of one "
        "timed step per variant (one process, rotating order); memory from one fresh process per variant"
    )
    print()
    print("| variant | trainable params | ms/step (median) | rounds (ms/step) | peak memory (GB) | before the first "
          "step (GB) | speed-up vs (a) | speed-up vs (b) | compiled vs eager |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for v, row in summary["rows"].items():
        print(
            f"| ({v}) {row['description']} | {row['trainable_params']:,} | {row['median_ms']:.0f} | "
            f"{' / '.join(f'{x:.0f}' for x in row['rounds_ms'])} | {fmt(row['peak_gb'], '.2f')} | "
            f"{fmt(row['after_build_gb'], '.2f')} | {fmt(row['speedup_vs_a'], '.2f', 'x')} | "
            f"{fmt(row['speedup_vs_b'], '.2f', 'x')} | {fmt(row['speedup_vs_eager'], '.2f', 'x')} |"
        )
    if summary["targets"]:
        print()
        print("| target | measured (speed: median of per-round ratios) | met |")
        print("|---|---|---|")
        for target in summary["targets"]:
            print(f"| {target['target']} | {target['measured']} | {'met' if target['met'] else 'missed'} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_common_arguments(parser, repeats=5)
    parser.add_argument("--batch-size", type=int, default=8, help="images (and captions) per step")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first (allocations, AdamW state)")
    parser.add_argument("--variants", default="abcde", help="which of a-e (A-E: compiled) to run, e.g. 'de', 'bdBD'")
    parser.add_argument(
        "--skip-memory", action="store_true", help="no fresh-process peak-memory runs (quicker; smoke tests)"
    )
    parser.add_argument(
        "--flops", action="store_true", help="only count each variant's GFLOP per step (no timing; load-independent)"
    )
    parser.add_argument("--worker", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    common.apply_threads(args)
    if args.worker:
        torch.set_grad_enabled(True)
        print(json.dumps(memory_worker(args)))
        return 0
    if not args.variants or set(args.variants) - set(VARIANTS):
        parser.error(f"--variants takes letters among {''.join(VARIANTS)}, got {args.variants!r}")
    variants = "".join(v for v in VARIANTS if v in args.variants)
    if args.flops and not variants.islower():
        parser.error("--flops counts the eager variants only (a-e): a compiled graph's products are the same")
    if not variants.islower():
        args.warmup = max(args.warmup, 2)  # the first steps compile (forward, then backward): never timed
    device = torch.device(args.device)
    info = common.machine(device)
    if args.flops:
        counts = count_step_flops(variants, args, device)
        ratios = {v: counts["b"] / counts[v] for v in variants if "b" in counts}
        print("\n".join(f"  ({v}) FLOP ratio (b)/({v}): {r:.2f}x" for v, r in ratios.items()))
        common.write_json(args.json, {"machine": info, "arguments": vars(args), "gflop_per_step": counts,
                                      "flop_ratio_vs_b": ratios})  # fmt: skip
        return 0

    memory = {}
    if not args.skip_memory:
        passed = [
            "--device", args.device, "--lm", args.lm, "--batch-size", str(args.batch_size),
            "--warmup", str(args.warmup), *(["--tiny"] if args.tiny else []),
            *(["--threads", str(args.threads)] if args.threads else []),
        ]  # fmt: skip
        for v in variants:
            memory[v] = common.run_worker(__file__, [*passed, "--worker", v])
            print(f"  memory ({v}): peak {memory[v]['peak_bytes'] / 1e9:.2f} GB", flush=True)
    runs, params = time_interleaved(variants, args, device)
    summary = summarise(runs, params, memory, variants)
    print_report(summary, args, info)
    common.write_json(args.json, {"machine": info, "arguments": vars(args), "runs": runs, "memory": memory, **summary})
    return 0


if __name__ == "__main__":
    sys.exit(main())

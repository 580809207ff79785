"""The demo's training step with torch's default CPU runtime ("before") and with `itune_hf.utils.runtime` ("after").

"after" is what `itune train` applies on a CPU (the CLI starts itself once more with glibc's allocator settings, which
glibc reads at process start only): glibc keeps freed memory for reuse instead of mapping and unmapping every large
tensor (the LM's logits and their gradients are ~200 MB each at the demo's size), short OpenMP
spinning, threads = available CPUs. Each setting runs in a fresh process (OpenMP reads its settings when torch
loads), idle and with one competing CPU-bound process (a Python busy loop) started beside it. Reported: the median
over steps of wall seconds, user and system CPU seconds and minor page faults per step, and the speed-up of "after"
over "before" under the same load, measured in this one run.

An AVX2-only host (no native bf16) can be emulated on a newer CPU with
`ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 python benchmarks/bench_cpu_runtime.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = str(Path(__file__).resolve())
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
SETTINGS = ("before", "after")
LOADS = ("idle", "one competing process")


def _usage() -> tuple[float, float, float, int]:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), used.ru_utime, used.ru_stime, used.ru_minflt


def _build(tiny: bool):
    import torch
    from peft import get_peft_model

    from itune_hf import ITuningAdapterConfig, build_model

    preset = "itune-tiny-random" if tiny else "itune-demo"  # the demo: SmolLM2-135M (real weights) + small ViT
    torch.manual_seed(0)
    base = build_model(preset, pretrained=not tiny, add_ituning_modules=False)
    return get_peft_model(base, ITuningAdapterConfig(first_layer=base.config.first_layer)), base.config


def worker(args: argparse.Namespace) -> dict:
    """One setting in this fresh process: returns per-step medians and the machine facts."""
    if args.setting == "after":
        from itune_hf.utils.runtime import set_openmp_environment

        set_openmp_environment()  # before torch loads, as the CLI does
    import torch

    from itune_hf.utils.runtime import configure_cpu_runtime

    runtime = configure_cpu_runtime().describe() if args.setting == "after" else "torch defaults"
    if args.threads:
        torch.set_num_threads(args.threads)
    model, config = _build(args.tiny)
    generator = torch.Generator().manual_seed(0)
    batch, length = (4, 8) if args.tiny else (32, 32)  # the demo's batch and caption budget
    tokens = config.vision_config.image_size // config.vision_config.patch_size
    vision = torch.randn(batch, tokens**2 + 1, config.vision_config.hidden_size, generator=generator)
    labels = torch.randint(0, config.text_config.vocab_size, (batch, length), generator=generator)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    model.train()
    steps = []
    for _ in range(args.steps + 1):  # the first step (one-off allocations) is not counted
        before = _usage()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = model(encoder_outputs=vision, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        after = _usage()
        steps.append([b - a for a, b in zip(before, after)])
    wall, user, system, faults = (statistics.median(step[i] for step in steps[1:]) for i in range(4))
    return {
        "runtime": runtime,
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "wall_s": wall,
        "user_s": user,
        "sys_s": system,
        "minor_faults": faults,
        "steps": [step[0] for step in steps[1:]],
    }


def _measure(args: argparse.Namespace, setting: str, load: str) -> dict:
    command = [sys.executable, SCRIPT, "--worker", "--setting", setting, "--steps", str(args.steps)]
    command += ["--precision", args.precision] + (["--tiny"] if args.tiny else [])
    command += ["--threads", str(args.threads)] if args.threads else []
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("GOMP_", "MALLOC_", "ITUNE_RUNTIME"))}
    if setting == "after":  # what the CLI restarts itself with (glibc reads these at process start only)
        from itune_hf.utils.runtime import process_environment

        environment.update(process_environment())
    competitor = None
    if load != "idle":
        competitor = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        environment["PYTHONWARNINGS"] = "ignore"
        result = subprocess.run(command, capture_output=True, text=True, env=environment)
    finally:
        if competitor is not None:
            competitor.kill()
            competitor.wait()
    if result.returncode != 0:
        raise RuntimeError(f"{setting}/{load} failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6, help="measured steps per setting (after one warm-up step)")
    parser.add_argument("--precision", default="no", choices=["no", "bf16"], help="no: fp32 (an AVX2 host's choice)")
    parser.add_argument("--threads", type=int, help="torch threads (default: the setting's own choice)")
    parser.add_argument("--tiny", action="store_true", help="tiny random model (smoke test; timings meaningless)")
    parser.add_argument("--loads", default="idle,busy", help="idle, busy (one competing process) or both")
    parser.add_argument("--json", metavar="OUT", help="also write every measurement to this JSON file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--setting", choices=SETTINGS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    loads = [LOADS[0] if name == "idle" else LOADS[1] for name in args.loads.split(",")]
    print(f"load average at start: {os.getloadavg()[0]:.2f}; precision {args.precision}; {args.steps} steps each")
    rows = {(load, setting): _measure(args, setting, load) for load in loads for setting in SETTINGS}
    first = next(iter(rows.values()))
    print(f"CPU capability (torch): {first['cpu_capability']}; nproc {os.cpu_count()}")
    print("\n| load | runtime | s/step | user s | sys s | sys share | page faults/step | speed-up |")
    print("|---|---|---|---|---|---|---|---|")
    for (load, setting), row in rows.items():
        share = row["sys_s"] / max(row["user_s"] + row["sys_s"], 1e-9)
        speedup = rows[(load, "before")]["wall_s"] / row["wall_s"]
        print(
            f"| {load} | {setting}: {row['runtime']} | {row['wall_s']:.2f} | {row['user_s']:.2f} | {row['sys_s']:.2f} "
            f"| {share:.0%} | {row['minor_faults']:,.0f} | {speedup:.2f}x |"
        )
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    if args.json:
        payload = {"rows": [{"load": k[0], "setting": k[1], **v} for k, v in rows.items()]}
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

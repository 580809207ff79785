"""Memory of several domains on one frozen base (issue 31.3): N adapters through `load_adapter_set` against N
captioners loaded one by one (`load_captioner`), as parameter bytes and resident memory (RSS) of a fresh process.

The adapters are random I-Tuning adapters of one preset (`--preset`, default `itune-demo`: SmolLM2-135M from PyPI and
the demo's tiny tower), saved as `itune train` saves them; each measurement runs in its own process.

    python benchmarks/bench_adapter_memory.py --preset itune-demo --adapters 1,2,4
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def make_adapters(preset: str, count: int, root: Path) -> list[Path]:
    """`count` random adapters of `preset` (seeds 0..count-1) saved with their processor under `root`."""
    import torch
    from peft import get_peft_model

    from itune_hf import ITuningAdapterConfig
    from itune_hf.hub import save_captioner
    from itune_hf.presets import build_model, build_processor, get_preset

    paths = []
    settings = get_preset(preset).settings
    for seed in range(count):
        base = build_model(preset, pretrained=True, add_ituning_modules=False)
        torch.manual_seed(seed)
        adapted = get_peft_model(base, ITuningAdapterConfig(**{**settings, "init": "random"}))
        paths.append(save_captioner(adapted, root / f"domain{seed}", processor=build_processor(preset)))
    return paths


def measure(mode: str, paths: list[str]) -> dict:
    """Load the adapters (`mode`: "shared" on one base, or "separate" captioners) and report their memory."""
    import resource

    import torch

    from itune_hf.adapter.switching import load_adapter_set
    from itune_hf.models.loading import load_captioner

    if mode == "shared":
        models = [load_adapter_set({f"d{i}": path for i, path in enumerate(paths)}).model]
    else:
        models = [load_captioner(path)[0] for path in paths]
    tensors = {id(p): p for model in models for p in [*model.parameters(), *model.buffers()]}
    rss = int(Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0]) * 1024
    return {
        "mode": mode,
        "adapters": len(paths),
        "parameter_bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
        "rss_bytes": rss,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "torch": torch.__version__,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="itune-demo")
    parser.add_argument("--adapters", default="1,2,4", help="Comma-separated numbers of adapters.")
    parser.add_argument("--measure", nargs="+", default=None, help=argparse.SUPPRESS)  # MODE PATH...: child process
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure[0], args.measure[1:])))
        return
    counts = [int(n) for n in args.adapters.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        paths = [str(p) for p in make_adapters(args.preset, max(counts), Path(tmp))]
        print("| adapters | loaded | parameter MB | RSS MB | peak RSS MB |\n|---|---|---|---|---|")
        for count in counts:
            for mode in ("shared", "separate"):
                command = [sys.executable, __file__, "--measure", mode, *paths[:count]]
                row = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
                print(
                    f"| {count} | {'one base (load_adapter_set)' if mode == 'shared' else 'one captioner each'} | "
                    f"{row['parameter_bytes'] / 1e6:.1f} | {row['rss_bytes'] / 1e6:.0f} | "
                    f"{row['peak_rss_bytes'] / 1e6:.0f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()

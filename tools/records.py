"""Write the records in `benchmarks/records/` that the README and the cards quote (docs/figures.md).

    python tools/records.py parameters          # parameters.json: every preset's trainable count, from the presets
    python tools/records.py demo outputs/demo   # demo.json's "latest": the run `make demo` just made, on this CPU

A record is the one place a figure is written down; tests/package/test_readme.py checks that the README, docs/ and
model_cards/ quote each figure as its record holds it (and that parameters.json is what the presets build).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from datetime import date
from pathlib import Path

RECORDS = Path(__file__).resolve().parents[1] / "benchmarks" / "records"
# presets whose counts the README, docs and cards quote; XGPT's Table 3 architectures are counted too
COUNTED_PRESETS = (
    "itune-gpt2-base", "itune-gpt2-medium", "itune-gpt2-large", "itune-gpt2-large-drop18", "itune-demo",
    "itune-demo-resnet",
    "xgpt-base", "xgpt-tiny", "xgpt-demo", "clipcap-mlp-gpt2", "clipcap-transformer-gpt2", "crossattn-gpt2",
    "clipcap-mlp-demo", "clipcap-transformer-demo", "crossattn-demo",
)  # fmt: skip
XGPT_ARCHITECTURES = ("enc", "encdec", "encdec_share")
ROWS = ("adapter", "adapter, shuffled images", "adapter disabled")  # the order the README's demo table shows them
SCORE_KEYS = {"CIDEr": "CIDEr", "BLEU-4": "Bleu_4", "ROUGE-L": "ROUGE_L", "object F1": "Object_F1"}


def trainable_parameters(preset_name: str, **overrides) -> int:
    """The trainable parameter count of a preset, as `itune params` computes it (on the meta device).

    Args:
        preset_name: A preset name.
        **overrides: Settings replaced in its config (e.g. `architecture="enc"`, `first_layer=0`).
    """
    import torch

    from itune_hf.presets import get_preset

    preset = get_preset(preset_name)
    config = preset.config(**overrides)
    with torch.device("meta"):
        model = preset.family.load("model_class")(config)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def parameter_counts() -> dict[str, int]:
    """Every counted preset's trainable parameters, plus `<xgpt preset>/<architecture>` and the demo's I-Tuning with
    modules in all 30 layers (`itune-demo/first_layer=0`)."""
    counts = {name: trainable_parameters(name) for name in COUNTED_PRESETS}
    for name in ("xgpt-tiny", "xgpt-base"):
        counts |= {f"{name}/{a}": trainable_parameters(name, architecture=a) for a in XGPT_ARCHITECTURES}
    counts["itune-demo/first_layer=0"] = trainable_parameters("itune-demo", first_layer=0)
    counts["itune-gpt2-base/first_layer=6"] = trainable_parameters("itune-gpt2-base", first_layer=6)
    return counts


def write_parameters() -> None:
    record = {
        "what": "trainable parameters of each preset (frozen backbones not counted)",
        "command": "python tools/records.py parameters  (each count: itune params --preset NAME)",
        "counts": parameter_counts(),
    }
    (RECORDS / "parameters.json").write_text(json.dumps(record, indent=2) + "\n")


def _cpu() -> str:
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    native_bf16 = "avx512_bf16" in flags or "amx_bf16" in flags
    isa = "AVX512-BF16/AMX" if native_bf16 else "AVX-512" if "avx512f" in flags else "AVX2 only"
    return f"{name or platform.processor()}, {os.cpu_count()} cores, {isa}"


def write_demo(output_dir: Path, records: Path = RECORDS) -> None:
    """Record the run `itune demo --output-dir OUTPUT_DIR` made on this machine (its `demo_results.json`) as
    demo.json's latest; the run that was latest moves to the front of the earlier runs, and the constant caption's
    scores stay as they are."""
    results = json.loads((output_dir / "demo_results.json").read_text())
    path = records / "demo.json"
    record = json.loads(path.read_text())
    train, test = results["train"], results["test"]
    if record.get("latest"):
        record["earlier"] = [record["latest"], *record.get("earlier", [])]
    record["latest"] = {
        "date": date.today().isoformat(),
        "hardware": _cpu(),
        "emulated": bool(os.environ.get("ONEDNN_MAX_CPU_ISA")),
        "threads": len(os.sched_getaffinity(0)),  # the CLI's runtime: one thread per available CPU
        "precision": {"no": "fp32"}.get(train["mixed_precision"], train["mixed_precision"]),
        "vision_tower": f"{results.get('preset', 'the demo preset')}'s, {results.get('vision', 'not recorded')}",
        "command": "make demo (itune demo, its defaults)",
        "steps": train["steps"],
        "captions_seen": train["captions_seen"],
        "whole_demo_seconds": round(results["seconds"]),
        "scores": {
            label: {name: round(scores[key], 3) for name, key in SCORE_KEYS.items() if key in scores}
            for label, scores in sorted(test.items(), key=lambda item: ROWS.index(item[0]) if item[0] in ROWS else 9)
        },
    }
    path.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="record", required=True)
    sub.add_parser("parameters")
    sub.add_parser("demo").add_argument("output_dir", type=Path)
    args = parser.parse_args(argv)
    write_parameters() if args.record == "parameters" else write_demo(args.output_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Write the records in `benchmarks/records/` that the README and the cards quote (docs/figures.md).

    python tools/records.py parameters          # parameters.json: every preset's trainable count, from the presets
    python tools/records.py demo outputs/demo --data-dir outputs/demo-data   # demo.json's "latest": the run `make
                                                # demo` just made, on this CPU, and the constant caption on its world

A record is the one place a figure is written down; tests/package/test_readme.py checks the tables that quote a
record and every parameter count quoted (docs/figures.md says exactly which), and that parameters.json is what the
presets build.
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
    "itune-demo-resnet", "itune-lite0-smollm2", "xgpt-lite0",
    "xgpt-base", "xgpt-tiny", "xgpt-demo", "clipcap-mlp-gpt2", "clipcap-transformer-gpt2", "crossattn-gpt2",
    "clipcap-mlp-demo", "clipcap-transformer-demo", "crossattn-demo",
)  # fmt: skip
XGPT_ARCHITECTURES = ("enc", "encdec", "encdec_share")
ROWS = ("adapter", "adapter, shuffled images", "adapter disabled")  # the order the README's demo table shows them
DEMO_TEST_IMAGES = 100  # itune demo's --test-images default (runs before demo_results.json recorded it)
SCORE_KEYS = {
    "CIDEr": "CIDEr", "BLEU-4": "Bleu_4", "ROUGE-L": "ROUGE_L", "object precision": "Object_P",
    "object recall": "Object_R", "object F1": "Object_F1", "exact scenes": "Exact_scene",
}  # fmt: skip
#: How the scene metric of a record's scores reads captions (itune_hf/metrics/objects.py); records made before it
#: counted a repeated phrase once and left hard-world sizes unchecked say so in their own "object_metric".
OBJECT_METRIC = "a repeated phrase names its objects again; sizes checked where the world records them (2026-11-28)"


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


def constant_caption(data_dir: Path, test_images: int) -> dict:
    """The best constant caption of the demo's world (chosen on its training split) scored on the test images the
    demo scores, as demo.json's "constant_caption"."""
    from itune_hf.data import load_captions
    from itune_hf.data.scenes import read_scenes
    from itune_hf.evaluation import constant_caption_floor

    dataset = data_dir / "dataset.json"
    splits, scenes = load_captions(str(dataset)), read_scenes(dataset)
    train = dict(zip(splits["train"]["image_id"], map(list, splits["train"]["captions"])))
    test = dict(list(zip(splits["test"]["image_id"], map(list, splits["test"]["captions"])))[:test_images])
    floor = constant_caption_floor(train, test, scenes=scenes)
    by_objects = floor["object_caption_scores"]
    return {
        "what": f"the best constant caption (one training caption for every image, chosen on the training split: by "
        f"CIDEr-D, and by object F1), scored on the demo's {len(test)} test images",
        "caption": floor["caption"],
        "scores": {"CIDEr": round(floor["CIDEr"], 3), "object F1": round(floor["Object_F1"], 3)},
        "object_caption": floor["object_caption"],
        "object_caption_scores": {
            "CIDEr": round(by_objects["CIDEr"], 3),
            "object F1": round(by_objects["Object_F1"], 3),
        },
        "object_metric": OBJECT_METRIC,
        "command": f"python tools/records.py demo {'OUTPUT_DIR'} --data-dir {data_dir}",
    }


def write_demo(output_dir: Path, data_dir: Path | None = None, records: Path = RECORDS) -> None:
    """Record the run `itune demo --output-dir OUTPUT_DIR` made on this machine (its `demo_results.json`) as
    demo.json's latest (the run that was latest moves to the front of the earlier runs) and, given the demo's
    `--data-dir`, the best constant caption on the same test images."""
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
        "object_metric": OBJECT_METRIC,
        "scores": {
            label: {name: round(scores[key], 3) for name, key in SCORE_KEYS.items() if key in scores}
            for label, scores in sorted(test.items(), key=lambda item: ROWS.index(item[0]) if item[0] in ROWS else 9)
        },
    }
    if data_dir is not None:
        record["constant_caption"] = constant_caption(data_dir, results.get("test_images", DEMO_TEST_IMAGES))
    path.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="record", required=True)
    sub.add_parser("parameters")
    demo = sub.add_parser("demo")
    demo.add_argument("output_dir", type=Path)
    demo.add_argument("--data-dir", type=Path, default=None, help="the demo's --data-dir: record the constant caption")
    args = parser.parse_args(argv)
    write_parameters() if args.record == "parameters" else write_demo(args.output_dir, args.data_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())

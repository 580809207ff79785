"""Shared parts of the model benchmarks: the models compared, the inputs, timing and the machine description.

Both sides are built from the same stored backbone configs (`itune_hf/presets/backbones/*.json`) with random
weights: the I-Tuning presets, and a `VisionEncoderDecoderModel` whose encoder is the same `CLIPVisionModel`
(transformers 5 accepts any `AutoModel` vision tower as the encoder) and whose decoder is the same GPT-2 with
`add_cross_attention=True`.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # backbones are built from configs; nothing is downloaded
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

# --lm name -> (I-Tuning preset, its LM backbone). The vision tower is CLIP ViT-B/16 in every preset.
LM_PRESETS = {"gpt2": "itune-gpt2-base", "gpt2-medium": "itune-gpt2-medium", "gpt2-large": "itune-gpt2-large"}
TINY_PRESET = "itune-tiny-random"  # CLIP-style 32x32 tower and a 3-layer GPT-2 of width 32: smoke runs only
CAPTION_LENGTH = 20  # tokens per training caption, and new tokens per generated caption


def preset_name(lm: str, tiny: bool) -> str:
    return TINY_PRESET if tiny else LM_PRESETS[lm]


def build_ituning(lm: str, tiny: bool, *, drop: bool):
    """I-Tuning with modules in every LM layer, or (`drop`) only in the upper half (I-Tuning Dropping)."""
    from itune_hf.presets import build_model, get_preset

    name = preset_name(lm, tiny)
    layers = get_preset(name).text.to_config().num_hidden_layers
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return build_model(name, first_layer=layers // 2 if drop else 0)


def build_ved(lm: str, tiny: bool):
    """`VisionEncoderDecoderModel` on the same backbone configs: the CLIP vision tower as the encoder, GPT-2 with
    cross-attention as the decoder (every weight random; decoding settings as the I-Tuning model's)."""
    from transformers import VisionEncoderDecoderConfig, VisionEncoderDecoderModel

    from itune_hf.presets import get_preset

    preset = get_preset(preset_name(lm, tiny))
    decoder = preset.text.to_config()
    decoder.is_decoder = True
    decoder.add_cross_attention = True
    config = VisionEncoderDecoderConfig.from_encoder_decoder_configs(preset.vision.to_config(), decoder)
    token = decoder.eos_token_id  # GPT-2's <|endoftext|>: BOS, EOS and padding, as in the I-Tuning presets
    config.decoder_start_token_id = config.pad_token_id = config.eos_token_id = token
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = VisionEncoderDecoderModel(config=config)
    model.generation_config.decoder_start_token_id = token
    model.generation_config.pad_token_id = token
    model.generation_config.eos_token_id = token
    return model


def freeze_ved_backbones(model) -> None:
    """Freeze everything but the decoder's cross-attention blocks (and the encoder-to-decoder projection that VED adds
    when the widths differ): VED's counterpart of frozen-backbone I-Tuning."""
    for name, parameter in model.named_parameters():
        parameter.requires_grad_("crossattention" in name or "ln_cross_attn" in name or "enc_to_dec_proj" in name)


def image_shape(lm: str, tiny: bool) -> tuple[int, int, int]:
    from itune_hf.presets import get_preset

    size = get_preset(preset_name(lm, tiny)).vision.to_config().image_size
    return (3, size, size)


def vision_states_shape(lm: str, tiny: bool) -> tuple[int, int]:
    from itune_hf.presets import get_preset

    vision = get_preset(preset_name(lm, tiny)).vision.to_config()
    return ((vision.image_size // vision.patch_size) ** 2 + 1, vision.hidden_size)


def trainable_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(function, device: torch.device) -> float:
    """Seconds one call of `function` takes (the device synchronised before and after)."""
    synchronize(device)
    start = time.perf_counter()
    function()
    synchronize(device)
    return time.perf_counter() - start


def median(values) -> float:
    return statistics.median(values)


def matmul_peak_gflops(device: torch.device, size: int = 4096, repeats: int = 5) -> tuple[float, list[float]]:
    """Measured fp32 GEMM throughput (GFLOP/s) of a `size` x `size` matrix product: the median and every run."""
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    a @ b  # warm-up (thread pool, BLAS dispatch)
    runs = [2 * size**3 / timed(lambda: a @ b, device) / 1e9 for _ in range(repeats)]
    return median(runs), runs


def machine(device: torch.device) -> dict[str, str]:
    """What the numbers were measured on."""
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU: {cpu}",
        "nproc": str(os.cpu_count()),
        "torch threads": str(torch.get_num_threads()),
        "load average (1 min) at start": f"{os.getloadavg()[0]:.2f}",
        "Python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": version("transformers"),
    }
    return info


def print_machine(info: dict[str, str]) -> None:
    for key, value in info.items():
        print(f"{key}: {value}")


def run_worker(script: str, arguments: list[str]) -> dict:
    """Run `script --worker ...` in a fresh Python process and return the JSON it prints on its last line (a fresh
    process per measurement gives each its own peak-memory high-water mark)."""
    environment = {**os.environ, "PYTHONWARNINGS": "ignore"}
    result = subprocess.run([sys.executable, script, *arguments], capture_output=True, text=True, env=environment)
    if result.returncode != 0:
        raise RuntimeError(f"{Path(script).name} {' '.join(arguments)} failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def write_json(path: str | None, payload: dict) -> None:
    if path:
        Path(path).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")


def add_common_arguments(parser, *, repeats: int) -> None:
    parser.add_argument("--device", default="cpu", help="cpu or cuda (peak memory then from the CUDA allocator)")
    parser.add_argument("--repeats", type=int, default=repeats, help="independent runs; medians are reported")
    parser.add_argument("--lm", default="gpt2", choices=sorted(LM_PRESETS), help="the LM backbone (default GPT-2 base)")
    parser.add_argument("--tiny", action="store_true", help="tiny random backbones (smoke test; timings meaningless)")
    parser.add_argument("--json", metavar="OUT", help="also write every measurement to this JSON file")
    parser.add_argument(
        "--threads",
        type=int,
        help="CPU threads for torch (default: torch's choice, one per core); on a machine shared with other jobs, "
        "fewer threads than cores avoid stalls of threads waiting for a descheduled peer",
    )


def add_round_arguments(parser, *, batch_size: int, rounds: int = 5) -> None:
    """The options of the benchmarks that time arms round by round (`bench_optimizer`, `bench_packing`)."""
    parser.add_argument("--batch-size", type=int, default=batch_size)
    parser.add_argument("--rounds", type=int, default=rounds, help="timed rounds, one step of every arm in each")
    parser.add_argument("--tiny", action="store_true", help="the tiny random presets (smoke test; timings meaningless)")
    parser.add_argument("--threads", type=int, help="CPU threads for torch (default: one per core)")
    parser.add_argument("--json", metavar="OUT", help="also write the measurements to this JSON file")


def apply_threads(args) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)

"""AdamW's fused kernel against its default (foreach) kernel: the optimizer step alone and the whole training step.

    python benchmarks/bench_optimizer.py --threads 2
    python benchmarks/bench_optimizer.py --tiny --rounds 1     # smoke run: timings meaningless

`itune train` makes its AdamW fused wherever the kernel takes the parameters (`fused_optimizer_fits`: float tensors
on a CPU or CUDA device, outside FSDP). Both arms here are that optimizer, over the same parameter groups
(`parameter_groups`: decayed weights, undecayed norms and biases), with the run's default settings; only `fused`
differs.

Models (random weights, training mode; `--tiny`: the tiny random presets of the same families):

    xgpt-demo-resnet    XGPT trained whole (18M parameters, most of them the tied 50,257-token embedding)
    itune-demo-resnet   the demo's I-Tuning modules (6.1M) on the frozen SmolLM2-135M

Steps: batch `--batch-size` x 20 caption tokens, on vision states a tower computed once (what `--feature-cache`
gives). Each round times one step of each arm in turn, the optimizer step alone (gradients kept from the last
backward) and then the whole step; the ratio is taken within a round and the median over rounds is reported.
"""

from __future__ import annotations

import argparse
import sys

import _common as common
import torch

PRESETS = {"xgpt": "xgpt-demo-resnet", "itune": "itune-demo-resnet"}
TINY_PRESETS = {"xgpt": "xgpt-tiny-random", "itune": "itune-tiny-random"}
ARMS = ("foreach", "fused")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="xgpt,itune", help="of xgpt, itune (default both)")
    common.add_round_arguments(parser, batch_size=16)
    return parser.parse_args(argv)


def build(family: str, tiny: bool, batch_size: int):
    """The model as `itune train` trains it and a batch of cached vision states with 20-token captions."""
    from itune_hf import build_model, build_processor
    from itune_hf.models._shared.backbones import as_vision_tokens

    preset = (TINY_PRESETS if tiny else PRESETS)[family]
    torch.manual_seed(0)
    model = build_model(preset)
    model.train()
    vision = model.vision_model
    size = build_processor(preset).image_processor.crop_size["height"]  # the tower's input (a ResNet config has none)
    with torch.no_grad():
        states = vision(pixel_values=torch.randn(batch_size, 3, size, size)).last_hidden_state
    vocab = model.config.vocab_size if family == "xgpt" else model.config.text_config.vocab_size
    labels = torch.randint(0, min(vocab, 5000), (batch_size, common.CAPTION_LENGTH))
    # as `itune cache-features` stores them: a convolutional tower's feature map read as tokens
    inputs = {"vision_hidden_states": states} if family == "xgpt" else {"encoder_outputs": (as_vision_tokens(states),)}
    return model, {**inputs, "labels": labels}


def optimizers(model) -> dict[str, torch.optim.Optimizer]:
    from itune_hf.training import TrainingConfig
    from itune_hf.training.accelerator import parameter_groups

    config = TrainingConfig(output_dir="unused")
    made = {}
    for arm in ARMS:
        groups = parameter_groups(model, config.weight_decay)
        options = {"fused": True} if arm == "fused" else {"foreach": True}
        made[arm] = torch.optim.AdamW(groups, lr=1e-4, weight_decay=config.weight_decay, **options)
    return made


def measure(model, batch, rounds: int) -> dict[str, dict[str, list[float]]]:
    cpu = torch.device("cpu")
    made = optimizers(model)
    times = {arm: {"optimizer_ms": [], "step_ms": []} for arm in ARMS}

    def step(optimizer) -> None:
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for round_index in range(rounds + 1):
        order = ARMS if round_index % 2 == 0 else tuple(reversed(ARMS))
        for arm in order:
            optimizer = made[arm]
            model(**batch).loss.backward()
            alone = common.timed(optimizer.step, cpu)
            optimizer.zero_grad(set_to_none=True)
            whole = common.timed(lambda o=optimizer: step(o), cpu)
            if round_index > 0:  # round 0 warms both kernels up
                times[arm]["optimizer_ms"].append(alone * 1000)
                times[arm]["step_ms"].append(whole * 1000)
    return times


def summarise(times: dict) -> dict:
    rounds = len(times["foreach"]["step_ms"])
    result = {}
    for arm in ARMS:
        result[arm] = {key: round(common.median(values), 1) for key, values in times[arm].items()}
    for key in ("optimizer_ms", "step_ms"):
        ratios = [times["foreach"][key][i] / times["fused"][key][i] for i in range(rounds)]
        result[f"fused_speedup_{key.removesuffix('_ms')}"] = round(common.median(ratios), 2)
    return result


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    info = common.machine(torch.device("cpu"))
    common.print_machine(info)
    results = {}
    print("\n| model | trainable parameters | optimizer step, foreach / fused: ms (x) | whole step: ms (x) |")
    print("|---|---|---|---|")
    for family in args.models.split(","):
        model, batch = build(family, args.tiny, args.batch_size)
        row = summarise(measure(model, batch, args.rounds))
        row["trainable_parameters"] = common.trainable_parameters(model)
        results[(TINY_PRESETS if args.tiny else PRESETS)[family]] = row
        print(
            f"| {(TINY_PRESETS if args.tiny else PRESETS)[family]} | {row['trainable_parameters']:,} | "
            f"{row['foreach']['optimizer_ms']} / {row['fused']['optimizer_ms']} ({row['fused_speedup_optimizer']}x) | "
            f"{row['foreach']['step_ms']} / {row['fused']['step_ms']} ({row['fused_speedup_step']}x) |"
        )
        del model, batch
    common.write_json(args.json, {"machine": info, "batch_size": args.batch_size, "rounds": args.rounds, **results})
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""XGPT next to I-Tuning: training step and caption speed at the papers' sizes (random weights).

Models (the same frozen CLIP ViT-B/16 vision tower, random weights; `--tiny`: the tiny random presets):

    itune       I-Tuning on GPT-2 base (itune-gpt2-base): frozen LM, 14M trainable I-Tuning parameters
    xgpt-tiny   XGPT Tiny (6 shared layers, hidden 768): every parameter but the vision tower trains
    xgpt-base   XGPT Base (12 shared layers, hidden 768)

Training step: AdamW on the trainable parameters, real backward, training mode, batch `--batch-size` x 20 caption
tokens, on cached vision states (what `itune train --feature-cache` does; the tower is not in the step).
Captioning: `generate` from pixels (the tower included), greedy and beam search, `--new-tokens` tokens forced.

The models take their steps in turn, one timed step each per round after the warm-up (a change of load on a shared
machine hits all alike); ratios are taken within a round and the median over rounds is reported.

    python benchmarks/bench_xgpt.py --threads 1
    python benchmarks/bench_xgpt.py --tiny --repeats 1 --warmup 0    # smoke run: timings meaningless
"""

from __future__ import annotations

import argparse
import sys

import _common as common
import torch

MODELS = {"itune": "itune-gpt2-base", "xgpt-tiny": "xgpt-tiny", "xgpt-base": "xgpt-base"}
TINY_MODELS = {"itune": "itune-tiny-random", "xgpt-tiny": "xgpt-tiny-random", "xgpt-base": "xgpt-tiny-random"}
STATES_INPUT = {"itune": "encoder_outputs", "xgpt-tiny": "vision_hidden_states", "xgpt-base": "vision_hidden_states"}


def build(name: str, tiny: bool, device: torch.device):
    """The model (I-Tuning as a PEFT adapter on the bare base, as `itune train` builds it) and its vocabulary size."""
    from itune_hf import build_model

    preset = (TINY_MODELS if tiny else MODELS)[name]
    torch.manual_seed(0)
    if name == "itune":
        from peft import get_peft_model

        from itune_hf import ITuningAdapterConfig

        base = build_model(preset, add_ituning_modules=False)
        model = get_peft_model(base, ITuningAdapterConfig(first_layer=base.config.first_layer))
        return model.to(device), base.config.text_config.vocab_size, base.vision_model
    model = build_model(preset)
    return model.to(device), model.config.vocab_size, model.vision_model


def training_step(model, optimizer, batch: dict) -> None:
    loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def make_batch(name: str, vision_model, vocab: int, args, device: torch.device) -> dict:
    size = vision_model.config.image_size
    with torch.no_grad():
        states = vision_model(pixel_values=torch.randn(args.batch_size, 3, size, size, device=device)).last_hidden_state
    labels = torch.randint(0, vocab, (args.batch_size, common.CAPTION_LENGTH), device=device)
    return {STATES_INPUT[name]: states, "labels": labels}


def caption(model, pixel_values: torch.Tensor, beams: int, new_tokens: int) -> None:
    with torch.inference_mode():
        model.generate(
            pixel_values=pixel_values,
            num_beams=beams,
            do_sample=False,
            min_new_tokens=new_tokens,
            max_new_tokens=new_tokens,
        )


def measure_training(models: dict, args, device: torch.device) -> dict[str, list[float]]:
    setups = {}
    for name, (model, vocab, vision) in models.items():
        model.train()
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
        setups[name] = (model, optimizer, make_batch(name, vision, vocab, args, device))
    for _ in range(args.warmup):
        for model, optimizer, batch in setups.values():
            training_step(model, optimizer, batch)
    runs: dict[str, list[float]] = {name: [] for name in setups}
    for round_index in range(args.repeats):
        names = list(setups)[round_index % len(setups) :] + list(setups)[: round_index % len(setups)]
        for name in names:
            model, optimizer, batch = setups[name]
            step = lambda m=model, o=optimizer, b=batch: training_step(m, o, b)  # noqa: E731
            runs[name].append(common.timed(step, device))
    return runs


def measure_captioning(models: dict, args, device: torch.device) -> dict[str, dict[str, list[float]]]:
    results: dict[str, dict[str, list[float]]] = {}
    for batch_size in args.batch_sizes:
        for beams in args.beams:
            key = f"batch {batch_size}, {'greedy' if beams == 1 else f'beam {beams}'}"
            results[key] = {name: [] for name in models}
            for model, _, _ in models.values():
                model.eval()
            pixels = {
                name: torch.randn(batch_size, 3, vision.config.image_size, vision.config.image_size, device=device)
                for name, (_, _, vision) in models.items()
            }
            for name, (model, _, _) in models.items():
                for _ in range(args.warmup):
                    caption(model, pixels[name], beams, args.new_tokens)
            for _ in range(args.repeats):
                for name, (model, _, _) in models.items():
                    call = lambda m=model, x=pixels[name], k=beams: caption(m, x, k, args.new_tokens)  # noqa: E731
                    results[key][name].append(batch_size / common.timed(call, device))
    return results


def print_tables(models: dict, training: dict, captioning: dict) -> dict:
    rows = {}
    print("\n| model | trainable parameters | ms/step | vs I-Tuning |")
    print("|---|---|---|---|")
    base = training["itune"]
    for name, (model, _, _) in models.items():
        ratio = common.median([t / b for t, b in zip(training[name], base)])
        ms = 1000 * common.median(training[name])
        rows[name] = {"trainable": common.trainable_parameters(model), "ms_per_step": ms, "vs_itune": ratio}
        print(f"| {name} | {rows[name]['trainable']:,} | {ms:.0f} | {ratio:.2f}x |")
    print("\n| captioning | " + " | ".join(f"{name} captions/s" for name in models) + " |")
    print("|---|" + "---|" * len(models))
    for key, speeds in captioning.items():
        print(f"| {key} | " + " | ".join(f"{common.median(speeds[name]):.2f}" for name in models) + " |")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--repeats", type=int, default=3, help="rounds; medians are reported")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps/calls per model first")
    parser.add_argument("--batch-size", type=int, default=8, help="captions per training step")
    parser.add_argument("--batch-sizes", default="1,16", help="comma-separated images per generate call")
    parser.add_argument("--beams", default="1,2,5", help="comma-separated beam counts (1 = greedy)")
    parser.add_argument("--new-tokens", type=int, default=common.CAPTION_LENGTH)
    parser.add_argument("--tiny", action="store_true", help="tiny random presets (smoke test; timings meaningless)")
    parser.add_argument("--threads", type=int, help="CPU threads for torch (default: one per core)")
    parser.add_argument("--json", metavar="OUT", help="also write every measurement to this JSON file")
    args = parser.parse_args()
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    args.beams = [int(b) for b in args.beams.split(",")]
    common.apply_threads(args)
    device = torch.device(args.device)
    info = common.machine(device)
    common.print_machine(info)
    models = {name: build(name, args.tiny, device) for name in MODELS}
    training = measure_training(models, args, device)
    captioning = measure_captioning(models, args, device)
    rows = print_tables(models, training, captioning)
    common.write_json(args.json, {"machine": info, "rows": rows, "training": training, "captioning": captioning})
    return 0


if __name__ == "__main__":
    sys.exit(main())

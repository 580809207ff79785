"""Faster CPU captioning: captions/s of `optimize_for_inference` settings against fp32 eager and against VED.

Speed: one whole `generate(pixel_values=...)` call per measurement (vision tower included), exactly
`--new-tokens` new tokens, greedy and beam 5, batch 1 and 16. The length is fixed by an EOS id outside the
vocabulary (no beam can end; `eos_token_id=None` is not enough: `generate` fills it from the model's own generation
config), not by `min_new_tokens`: that adds a logits processor real captioning does not run, a
vocabulary-wide `torch.where` on every beam at every step (80 x 49,152 values per step at beam 5, batch 16), which
took about a quarter of a bf16 call and so shrank every speed-up. The process runs as `itune caption` runs (the
CLI's allocator and OpenMP settings, `itune_hf.utils.runtime`). Variants, all in one process, timed once per setting per
run in rotating order:

* `fp32`: the model as loaded (eager fp32; the baseline, and what a user gets by default),
* `fp32-opt`: `optimize_for_inference(model)` at its defaults (bit-exact: contiguous LM-head input only),
* `int8`: `optimize_for_inference(model, int8=True)`,
* `bf16`: `optimize_for_inference(model, precision="bf16")`, only where bf16 is native,
* `shortlist`: `optimize_for_inference(model, vocabulary=caption_vocabulary(processor, train_captions))`: the LM
  head and beam search over the tokens of the training captions of `--data` only (fp32),
* `bf16+shortlist`: both, only where bf16 is native,
* `ved`: a `VisionEncoderDecoderModel` of the same size: the model's own vision tower config and a GPT-2 decoder of
  the LM's width, depth, heads and vocabulary with cross-attention (random weights; Llama has no cross-attention).

Agreement: the test images of `--data` (a Karpathy-style dataset.json) are captioned by every variant the normal way
(EOS stops, `--max-new-tokens`), and each variant's captions are compared with the fp32 captions: exact-match rate,
and CIDEr-D of the variant's captions with the fp32 caption of each image as the only reference (fp32 against
itself gives the ceiling, also printed).
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import sys
from pathlib import Path

from itune_hf.utils.runtime import restart_with_runtime_environment, set_openmp_environment

if __name__ == "__main__":  # as the `itune` CLI does: OpenMP's settings before torch loads, glibc's at process start
    set_openmp_environment()
    restart_with_runtime_environment()

import _common as common  # noqa: E402
import torch  # noqa: E402

#: variant -> `optimize_for_inference` settings (None: the model as loaded); "vocabulary" is filled in per run
VARIANTS = {
    "fp32": None,
    "fp32-opt": {},
    "int8": {"int8": True},
    "bf16": {"precision": "bf16"},
    "shortlist": {"vocabulary": True},
    "bf16+shortlist": {"precision": "bf16", "vocabulary": True},
}


def shortlist_of(args, model) -> list[int]:
    """The vocabulary shortlist: the tokens of the training captions of `--data` (never its test captions); for
    `--tiny`, every third token of the vocabulary and the special ones."""
    from itune_hf import ITuningProcessor
    from itune_hf.inference import caption_vocabulary

    if args.tiny:
        config = model.generation_config
        specials = {config.bos_token_id, config.eos_token_id, config.pad_token_id, config.decoder_start_token_id}
        return sorted(set(range(0, model.config.text_config.vocab_size, 3)) | (specials - {None}))
    rows = json.loads(Path(args.data).read_text())["images"]
    captions = [s["raw"] for r in rows if r["split"] in ("train", "restval") for s in r["sentences"]]
    return caption_vocabulary(ITuningProcessor.from_pretrained(args.model), captions)


def load_variant(args, name: str):
    """A fresh copy of the captioner with the variant's settings applied."""
    from itune_hf import ITuningForCaptioning
    from itune_hf.inference import optimize_for_inference

    if args.tiny:
        model = common.build_ituning("gpt2", True, drop=False)
    else:
        model = ITuningForCaptioning.from_pretrained(args.model)
    model.eval()
    settings = VARIANTS[name]
    if settings is not None:
        if settings.get("vocabulary"):
            settings = {**settings, "vocabulary": shortlist_of(args, model)}
        optimize_for_inference(model, **settings)
    return model


def build_ved_like(model):
    """A VED of the captioner's size: its vision tower config, a GPT-2 decoder as wide and deep as its LM."""
    from transformers import GPT2Config, VisionEncoderDecoderConfig, VisionEncoderDecoderModel

    text = model.config.text_config
    token = model.config.decoder_start_token_id or 0
    decoder = GPT2Config(
        n_embd=text.hidden_size,
        n_layer=text.num_hidden_layers,
        n_head=text.num_attention_heads,
        vocab_size=text.vocab_size,
        n_positions=max(getattr(text, "max_position_embeddings", 1024), 128),
        bos_token_id=token,
        eos_token_id=token,
        is_decoder=True,
        add_cross_attention=True,
    )
    config = VisionEncoderDecoderConfig.from_encoder_decoder_configs(model.config.vision_config, decoder)
    config.decoder_start_token_id = config.pad_token_id = config.eos_token_id = token
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        ved = VisionEncoderDecoderModel(config=config).eval()
    for key in ("decoder_start_token_id", "pad_token_id", "eos_token_id"):
        setattr(ved.generation_config, key, token)
    return ved


def caption(model, pixel_values: torch.Tensor, beams: int, new_tokens: int) -> torch.Tensor:
    """Exactly `new_tokens` new tokens: an EOS id no step can generate (see the module docstring)."""
    config = copy.deepcopy(model.generation_config)
    config.eos_token_id = model.config.get_text_config().vocab_size
    with torch.inference_mode():
        ids = model.generate(
            pixel_values=pixel_values, generation_config=config, num_beams=beams, do_sample=False,
            max_new_tokens=new_tokens,
        )  # fmt: skip
    if ids.shape[-1] != new_tokens + 1:  # the decoder start token, then the new tokens
        raise RuntimeError(f"{type(model).__name__} generated {ids.shape[-1] - 1} tokens, not {new_tokens}")
    return ids


def test_images(args, count: int):
    """`(inputs, decode, references)`: the first `count` test images of `--data` through the processor as `itune
    caption` feeds them (pixel values and the caption prefix), a function turning generated ids into caption strings,
    and each image's reference captions; for `--tiny`, random images and no references."""
    if args.tiny:
        shape = common.image_shape("gpt2", True)
        pixels = torch.randn(count, *shape, generator=torch.Generator().manual_seed(1))
        return {"pixel_values": pixels}, lambda ids: [" ".join(map(str, row.tolist())) for row in ids], None
    from PIL import Image

    from itune_hf import ITuningProcessor

    processor = ITuningProcessor.from_pretrained(args.model)
    data = Path(args.data)
    rows = [r for r in json.loads(data.read_text())["images"] if r["split"] == "test"][:count]
    images = [Image.open(data.parent / r["filepath"] / r["filename"]).convert("RGB") for r in rows]
    decode = functools.partial(processor.batch_decode, skip_special_tokens=True)
    references = {i: [s["raw"] for s in r["sentences"]] for i, r in enumerate(rows)}
    return dict(processor(images=images)), decode, references


def agreement(
    models: dict, inputs: dict, decode, references: dict | None, beams: int, max_new_tokens: int, batch: int
) -> dict:
    """Captions of every variant, their exact-match rate and CIDEr-D against the fp32 captions, and (with
    references) their CIDEr-D against the test references: whether a changed caption is a worse one."""
    from itune_hf.metrics import score_captions

    captions = {}
    for name, model in models.items():
        out = []
        for start in range(0, len(inputs["pixel_values"]), batch):
            chunk = {key: value[start : start + batch] for key, value in inputs.items()}
            with torch.inference_mode():
                ids = model.generate(**chunk, num_beams=beams, max_new_tokens=max_new_tokens)
            out.extend(decode(ids))
        captions[name] = out
    as_references = {i: [c] for i, c in enumerate(captions["fp32"])}
    result = {}
    for name, texts in captions.items():
        cider = score_captions(dict(enumerate(texts)), as_references, metrics=["CIDEr"])["CIDEr"]
        exact = sum(a == b for a, b in zip(texts, captions["fp32"])) / len(texts)
        result[name] = {"exact_match": exact, "cider_vs_fp32": cider, "captions": texts}
        if references is not None:
            scores = score_captions(dict(enumerate(texts)), references, metrics=["CIDEr"])
            result[name]["cider_vs_references"] = scores["CIDEr"]
    return result


def processor_size(model: str) -> int:
    """The image size the captioner's processor gives (a convolutional tower's config names none)."""
    from transformers import AutoProcessor

    from itune_hf.models._shared.images import shortest_edge_of

    return shortest_edge_of(AutoProcessor.from_pretrained(model).image_processor)


def time_speed(args, models: dict, settings: list[tuple[int, int]]) -> list[dict]:
    device = torch.device("cpu")
    shape = tuple(next(iter(models.values())).config.vision_config.to_dict()[k] for k in ("num_channels",))
    size = getattr(models["fp32"].config.vision_config, "image_size", None) or processor_size(args.model)
    generator = torch.Generator().manual_seed(0)
    images = {n: torch.randn(n, shape[0], size, size, generator=generator) for _, n in settings}
    for model in models.values():  # warm-up
        for beams in sorted({b for b, _ in settings}):
            caption(model, images[min(images)], beams, args.new_tokens)
    runs = []
    for repeat in range(args.repeats):
        for beams, batch in settings:
            order = list(models)
            order = order[repeat % len(order) :] + order[: repeat % len(order)]
            for name in order:
                call = functools.partial(caption, models[name], images[batch], beams, args.new_tokens)
                seconds = common.timed(call, device)
                runs.append({"repeat": repeat, "beams": beams, "batch": batch, "model": name,
                             "captions_per_s": batch / seconds})  # fmt: skip
                print(f"  run {repeat + 1} beams {beams} batch {batch} {name}: {batch / seconds:.2f} captions/s",
                      flush=True)  # fmt: skip
    return runs


def summarise(runs: list[dict], names: list[str], settings, repeats: int) -> list[dict]:
    rows = []
    for beams, batch in settings:
        cell = [r for r in runs if r["beams"] == beams and r["batch"] == batch]
        per_run = [{r["model"]: r["captions_per_s"] for r in cell if r["repeat"] == k} for k in range(repeats)]
        rows.append(
            {"beams": beams, "batch": batch,
             "captions_per_s": {m: common.median([run[m] for run in per_run]) for m in names},
             "vs_fp32": {m: common.median([run[m] / run["fp32"] for run in per_run]) for m in names},
             "vs_ved": {m: common.median([run[m] / run["ved"] for run in per_run]) for m in names}
                       if "ved" in names else {},
             "runs": {m: [round(run[m], 3) for run in per_run] for m in names}}
        )  # fmt: skip
    return rows


def print_tables(rows: list[dict], names: list[str], quality: dict) -> None:
    print("| decoding | batch | " + " | ".join(f"{n} captions/s" for n in names) + " | "
          + " | ".join(f"{n} / fp32" for n in names if n != "fp32") + " | "
          + "".join(f" {n} / VED |" for n in names if n != "ved" and "ved" in names))  # fmt: skip
    print("|---|---|" + "---|" * (2 * len(names) - 1 + (len(names) - 1 if "ved" in names else 0)))
    for row in rows:
        decoding = "greedy" if row["beams"] == 1 else f"beam {row['beams']}"
        rate, fp32, ved = row["captions_per_s"], row["vs_fp32"], row["vs_ved"]
        print(f"| {decoding} | {row['batch']} | " + " | ".join(f"{rate[n]:.2f}" for n in names) + " | "
              + " | ".join(f"{fp32[n]:.2f}x" for n in names if n != "fp32") + " | "
              + "".join(f" {ved[n]:.2f}x |" for n in names if n != "ved" and ved))  # fmt: skip
    print()
    print("| decoding | variant | exact match vs fp32 | CIDEr-D vs fp32 captions | CIDEr-D vs test references |")
    print("|---|---|---|---|---|")
    for decoding, result in quality.items():
        for name, cell in result.items():
            against_references = f"{cell['cider_vs_references']:.3f}" if "cider_vs_references" in cell else "-"
            print(f"| {decoding} | {name} | {cell['exact_match']:.1%} | {cell['cider_vs_fp32']:.3f} | "
                  f"{against_references} |")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_common_arguments(parser, repeats=3)
    parser.add_argument("--model", default="/tmp/prof/adapter", help="captioner checkpoint (full or adapter-only)")
    parser.add_argument("--data", default="/tmp/prof/world/dataset.json", help="dataset.json with a test split")
    parser.add_argument("--batch-sizes", default="1,16")
    parser.add_argument("--beams", default="1,5")
    parser.add_argument("--new-tokens", type=int, default=common.CAPTION_LENGTH)
    parser.add_argument("--agreement-images", type=int, default=30)
    parser.add_argument("--max-new-tokens", type=int, default=30, help="caption length limit for the agreement")
    args = parser.parse_args()
    common.apply_threads(args)
    from itune_hf.inference import native_bf16

    settings = [(int(b), int(n)) for n in args.batch_sizes.split(",") for b in args.beams.split(",")]
    info = common.machine(torch.device("cpu"))
    info["native bf16"] = str(native_bf16("cpu"))
    variants = [v for v in VARIANTS if not v.startswith("bf16") or native_bf16("cpu")]
    models = {name: load_variant(args, name) for name in variants}
    if hasattr(models["fp32"].config.vision_config, "hidden_size"):
        models["ved"] = build_ved_like(models["fp32"])
    else:  # VisionEncoderDecoderModel's cross-attention reads a token encoder of one width, not a feature map
        print(f"no VED row: its cross-attention needs a token encoder, and {args.model}'s tower is convolutional")
    names = list(models)

    runs = time_speed(args, models, settings)
    rows = summarise(runs, names, settings, args.repeats)
    inputs, decode, references = test_images(args, args.agreement_images)
    captioners = {n: m for n, m in models.items() if n != "ved"}
    batch = max(n for _, n in settings)
    quality = {
        ("greedy" if b == 1 else f"beam {b}"): agreement(
            captioners, inputs, decode, references, b, args.max_new_tokens, batch
        )
        for b in sorted({b for b, _ in settings})
    }

    print()
    common.print_machine(info)
    print(f"model: {'tiny preset' if args.tiny else args.model}; {args.new_tokens} new tokens per timed caption; "
          f"{args.repeats} runs; agreement on {len(inputs['pixel_values'])} images")  # fmt: skip
    print()
    print_tables(rows, names, quality)
    print()
    for row in rows:
        if row["beams"] > 1 and row["batch"] == batch:
            met = [n for n in names if n not in ("fp32", "ved") and row["vs_fp32"][n] >= 2.0]
            print(f"target (>= 2x fp32 at beam {row['beams']}, batch {batch}): met by {', '.join(met) or 'none'}")
    common.write_json(args.json, {"machine": info, "arguments": vars(args), "runs": runs, "rows": rows,
                                  "agreement": quality})  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

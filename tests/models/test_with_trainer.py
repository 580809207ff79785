"""`transformers.Trainer` on every family: every input the processor gives reaches `forward`, and gradient
accumulation takes the step the large batch takes (Trainer passes `num_items_in_batch`, the caption tokens of the
whole accumulated batch)."""

from __future__ import annotations

import pytest
import torch

from itune_hf import build_model

PRESETS = ["itune-tiny-random", "itune-tiny-random+peft", "clipcap-mlp-tiny-random", "crossattn-tiny-random",
           "xgpt-tiny-random"]  # fmt: skip
CAPTION_TOKENS = [6, 2, 4, 1]  # micro-batches of 8 and 5: a mean of their means is not the batch's mean


def rows_for(model) -> list[dict]:
    vision = getattr(model.config, "vision_config", None) or getattr(model.config, "encoder", None)
    size = getattr(vision, "image_size", 32)
    generator = torch.Generator().manual_seed(1)
    rows = []
    for length in CAPTION_TOKENS:
        ids = torch.randint(3, 50, (6,), generator=generator)
        rows.append({
            "pixel_values": torch.randn(3, size, size, generator=generator),
            "decoder_input_ids": ids,
            "labels": ids.masked_fill(torch.arange(6) >= length, -100),
        })  # fmt: skip
    return rows


def trainer_update(preset: str, batch_size: int, accumulation: int, tmp_path) -> dict[str, torch.Tensor]:
    """The change of every trainable weight after one SGD step (lr 1, no dropout) of `Trainer` over the 4 rows."""
    from peft import get_peft_model
    from transformers import Trainer, TrainingArguments

    from itune_hf import ITuningAdapterConfig

    torch.manual_seed(0)
    if preset.endswith("+peft"):
        base = build_model(preset.removesuffix("+peft"), add_ituning_modules=False)
        model = get_peft_model(base, ITuningAdapterConfig(first_layer=0, init="random"))
    else:
        model = build_model(preset, **({"first_layer": 0, "init": "random"} if preset.startswith("itune") else {}))
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "dropout", None), float):  # XGPT's attention drops functionally
            module.dropout = 0.0
    rows = rows_for(model.get_base_model() if preset.endswith("+peft") else model)
    args = TrainingArguments(
        tmp_path / f"{batch_size}x{accumulation}", max_steps=1, per_device_train_batch_size=batch_size,
        gradient_accumulation_steps=accumulation, learning_rate=1.0, optim="sgd", lr_scheduler_type="constant",
        report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True,
    )  # fmt: skip
    trainer = Trainer(model=model, args=args, train_dataset=rows)
    trainer._get_train_sampler = lambda *args, **kwargs: torch.utils.data.SequentialSampler(rows)
    before = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
    trainer.train()
    return {name: p.detach() - before[name] for name, p in model.named_parameters() if name in before}


@pytest.mark.parametrize("preset", PRESETS)
def test_gradient_accumulation_under_trainer_takes_the_large_batchs_step(preset, tmp_path):
    whole = trainer_update(preset, batch_size=4, accumulation=1, tmp_path=tmp_path)
    accumulated = trainer_update(preset, batch_size=2, accumulation=2, tmp_path=tmp_path)
    size = torch.cat([u.flatten() for u in whole.values()]).norm()
    difference = torch.cat([(whole[n] - accumulated[n]).flatten() for n in whole]).norm()
    assert size > 0
    # before: twice the step (I-Tuning, ClipCap), the mean of the micro-batches' means (XGPT), no loss (cross-attention)
    assert difference / size < 1e-4, f"{preset}: accumulated step differs by {float(difference / size):.3f}"


@pytest.mark.parametrize("preset", [p for p in PRESETS if not p.endswith("+peft")])
def test_trainer_hands_every_input_the_processor_gives_to_forward(preset, tmp_path):
    """Trainer drops the columns `forward` does not name (the cross-attention baseline lost `labels` and
    `decoder_attention_mask` so)."""
    from PIL import Image
    from transformers import Trainer, TrainingArguments

    from itune_hf.presets import build_processor

    model, processor = build_model(preset), build_processor(preset)
    images = [Image.new("RGB", (40, 32), color) for color in ((200, 30, 30), (30, 30, 200))]
    batch = processor(images=images, captions=["a red square on a field", "blue"])
    assert (batch["decoder_attention_mask"] == 0).any()  # padding: the mask matters
    rows = [{key: value[i] for key, value in batch.items()} for i in range(len(images))]
    received = []
    model.register_forward_pre_hook(lambda module, args, kwargs: received.append(set(kwargs)), with_kwargs=True)
    args = TrainingArguments(tmp_path, max_steps=1, per_device_train_batch_size=2, report_to=[], use_cpu=True,
                             save_strategy="no", disable_tqdm=True)  # fmt: skip
    Trainer(model=model, args=args, train_dataset=rows).train()
    assert set(batch) <= received[0], f"{preset}: forward did not get {sorted(set(batch) - received[0])}"

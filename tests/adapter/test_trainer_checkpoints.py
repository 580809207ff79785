"""Adapter-only `Trainer` checkpoints of a native I-Tuning model (`itune_hf.adapter.callback.AdapterCheckpoints`):
each checkpoint holds that step's adapter weights only, and loads back natively and with PEFT."""

from __future__ import annotations

import json

import torch

from itune_hf import build_model


def native_model_and_rows():
    """A native tiny I-Tuning model with random modules, and four training rows for it."""
    torch.manual_seed(0)
    model = build_model("itune-tiny-random", first_layer=0, init="random")
    size = model.config.vision_config.image_size
    rows = [{"pixel_values": torch.randn(3, size, size), "decoder_input_ids": ids, "labels": ids}
            for ids in torch.randint(3, 50, (4, 6))]  # fmt: skip
    return model, rows


def test_trainer_checkpoints_of_a_native_model_hold_only_the_adapter_and_restore(tmp_path):
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import Trainer, TrainingArguments

    from itune_hf import AdapterCheckpoints, ITuningForCaptioning

    model, rows = native_model_and_rows()
    size = model.config.vision_config.image_size
    args = TrainingArguments(
        tmp_path, max_steps=2, save_steps=1, per_device_train_batch_size=2, learning_rate=1e-2, report_to=[],
        use_cpu=True,
    )  # fmt: skip
    Trainer(model=model, args=args, train_dataset=rows, callbacks=[AdapterCheckpoints()]).train()
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    saved = {}
    for step in (1, 2):
        folder = tmp_path / f"checkpoint-{step}"
        assert not {"model.safetensors", "pytorch_model.bin"} & {p.name for p in folder.iterdir()}
        assert json.loads((folder / "config.json").read_text())["add_ituning_modules"] is False  # a bare reference
        saved[step] = load_file(folder / "adapter_model.safetensors")
        assert all(".ituning_modules." in key for key in saved[step])
        assert sum(t.numel() for t in saved[step].values()) == trainable
    assert any(not torch.equal(saved[1][key], saved[2][key]) for key in saved[2])  # each step's own weights
    model.eval()
    pixels = torch.randn(1, 3, size, size)
    ids = model.generate(pixel_values=pixels, num_beams=1, max_new_tokens=4)
    restored = ITuningForCaptioning.from_pretrained(tmp_path / "checkpoint-2")
    assert torch.equal(restored.generate(pixel_values=pixels, num_beams=1, max_new_tokens=4), ids)
    bare = build_model("itune-tiny-random", add_ituning_modules=False)
    with_peft = PeftModel.from_pretrained(bare, tmp_path / "checkpoint-2").eval()
    assert torch.equal(with_peft.generate(pixel_values=pixels, num_beams=1, max_new_tokens=4), ids)


def test_a_native_model_resumes_from_its_adapter_checkpoints_as_if_never_stopped(tmp_path):
    """`Trainer.train(resume_from_checkpoint=...)` of a native model from `AdapterCheckpoints`' checkpoints: the
    same adapter as an uninterrupted run (before, transformers refused: "Can't find a checkpoint index")."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from itune_hf import AdapterCheckpoints, ITuningForCaptioning

    class StopAfterStep2(TrainerCallback):  # an interruption: the run stops after its checkpoint at step 2
        def on_step_end(self, args, state, control, **kwargs):
            control.should_training_stop = state.global_step == 2

    def run(folder, stop=False, resume=None):
        model, rows = native_model_and_rows()
        args = TrainingArguments(
            folder, max_steps=4, save_steps=2, per_device_train_batch_size=2, learning_rate=1e-2, report_to=[],
            use_cpu=True, seed=3,
        )  # fmt: skip
        callbacks = [AdapterCheckpoints(), *([StopAfterStep2()] if stop else [])]
        Trainer(model=model, args=args, train_dataset=rows, callbacks=callbacks).train(resume)
        return {key: t for key, t in model.state_dict().items() if key.startswith("ituning.")}

    uninterrupted = run(tmp_path / "whole")
    run(tmp_path / "part", stop=True)
    checkpoint = tmp_path / "part" / "checkpoint-2"
    index = json.loads((checkpoint / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(uninterrupted) and index["metadata"]["itune_hf_trainable_only"]
    assert len(ITuningForCaptioning.from_pretrained(checkpoint).ituning) > 0  # the package still reads it as an adapter
    resumed = run(tmp_path / "part", resume=str(checkpoint))
    for key, tensor in uninterrupted.items():
        torch.testing.assert_close(resumed[key], tensor, msg=f"{key} differs after the resume")


def test_load_best_model_at_end_reloads_the_best_checkpoints_adapter(tmp_path):
    from safetensors.torch import load_file
    from transformers import Trainer, TrainingArguments

    from itune_hf import AdapterCheckpoints

    model, rows = native_model_and_rows()
    # training on the evaluation rows lowers their loss: "best" as the highest loss is an early checkpoint
    args = TrainingArguments(
        tmp_path, max_steps=4, save_steps=1, eval_steps=1, eval_strategy="steps", per_device_train_batch_size=2,
        learning_rate=1e-2, report_to=[], use_cpu=True, load_best_model_at_end=True, save_total_limit=2,
        metric_for_best_model="loss", greater_is_better=True,
    )  # fmt: skip
    trainer = Trainer(model=model, args=args, train_dataset=rows, eval_dataset=rows, callbacks=[AdapterCheckpoints()])
    trainer.train()
    best = trainer.state.best_model_checkpoint
    assert best is not None and args.load_best_model_at_end  # the setting is the user's again after training
    assert trainer.state.best_global_step < 4  # else this test would not tell the best weights from the last

    def sums(tensors):
        return sorted(t.sum().item() for t in tensors)

    loaded = sums(t for key, t in model.state_dict().items() if key.startswith("ituning."))
    assert loaded == sums(load_file(f"{best}/adapter_model.safetensors").values())
    assert loaded != sums(load_file(tmp_path / "checkpoint-4" / "adapter_model.safetensors").values())


def test_a_trainer_run_on_a_preset_model_finds_its_tokenizer_and_config_agreeing(tmp_path, capfd, caplog):
    from transformers import Trainer, TrainingArguments

    from itune_hf import build_processor

    model, rows = native_model_and_rows()
    args = TrainingArguments(tmp_path, max_steps=1, per_device_train_batch_size=2, report_to=[], use_cpu=True)
    processor = build_processor("itune-tiny-random")
    Trainer(model=model, args=args, train_dataset=rows, processing_class=processor).train()
    assert "new PAD/BOS/EOS tokens" not in capfd.readouterr().err + caplog.text

"""XGPT's pre-training tasks (`itune train --tasks ic,imlm,ida,tifg`, `itune_hf.training.pretraining`): each task's
inputs and targets, the masked fractions, no leakage (IMLM's encoder lacks the fragment, TIFG's target gets no
gradient), the losses falling, resume mid-epoch bit-exact, checkpoint averaging, I-Tuning's prefix-LM tasks and TIFG's
refusal, the alt-text world."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from itune_hf.cli import main
from itune_hf.data import make_synthetic
from itune_hf.data.synthetic import ALT_TEXT_SHAPES, SHAPES
from itune_hf.presets import build_model, build_processor
from itune_hf.training import TrainingConfig, train
from itune_hf.training.pretraining import Masking, Objective, masked_fraction, parse_tasks, tifg_loss

pytestmark = pytest.mark.slow  # learning runs, subprocesses, kills or benchmarks: only make test-slow runs them

PRESET = "xgpt-tiny-random"
TASKS = "ic,imlm,ida,tifg"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return make_synthetic(tmp_path_factory.mktemp("pretrain-world") / "data", num_images=16, seed=3, image_size=32)


@pytest.fixture(scope="module")
def processor():
    return build_processor(PRESET)


@pytest.fixture(scope="module")
def captions(world):
    data = json.loads(world.read_text())
    return [s["raw"] for image in data["images"] for s in image["sentences"]]


def objective_for(processor, family="xgpt", tasks=TASKS, masking=None):
    config = TrainingConfig(output_dir="unused", preset=PRESET, tasks=tasks, seed=0)
    built = Objective.for_run(config, family, processor)
    built.masking = masking or Masking()
    return built


def caption_batch(processor, texts):
    batch = processor(images=[torch.zeros(32, 32, 3, dtype=torch.uint8).numpy()] * len(texts), captions=texts)
    return dict(batch)


# ------------------------------------------------------------------------------------------------------------------
# Masking and task inputs
# ------------------------------------------------------------------------------------------------------------------
def test_measured_masked_fractions_match_the_chosen_rates(processor, captions):
    tokens = [processor.tokenizer(c, add_special_tokens=False)["input_ids"] for c in captions]
    imlm = masked_fraction("imlm", tokens, Masking())
    ida = masked_fraction("ida", tokens, Masking())
    assert abs(imlm - 0.5) < 0.05, imlm  # one fragment of round(0.5 * length) tokens
    assert abs(ida - 0.3) < 0.06, ida  # Poisson(3) spans up to round(0.3 * length)
    assert masked_fraction("ida", tokens, Masking(ida_mask_ratio=0.5)) > ida + 0.1


def test_imlm_encoder_lacks_the_fragment_and_the_decoder_generates_only_it(processor, captions):
    objective = objective_for(processor)
    task = objective.task_batch(caption_batch(processor, captions[:40]))
    task.generators = objective.generators("imlm", 0, 0, len(task.captions))
    inputs = objective_inputs(objective, "imlm", task)
    hidden = kept = 0
    for row, caption in enumerate(task.captions):
        labels = inputs["labels"][row][inputs["labels"][row] != -100].tolist()
        positions = inputs["decoder_position_ids"][row][: len(labels)].tolist()
        start = positions[0]
        assert labels == caption[start : start + len(labels)] and positions == list(range(start, start + len(labels)))
        assert inputs["decoder_input_ids"][row, 0] == processor.bos_token_id
        assert inputs["decoder_input_ids"][row, 1 : len(labels)].tolist() == labels[:-1]  # teacher forcing
        masked = inputs["encoder_masked_tokens"][row]
        encoder_ids = inputs["encoder_input_ids"][row]
        assert not masked[:start].any() and not masked[start + len(labels) :].any()
        assert encoder_ids[:start].tolist() == caption[:start]  # the rest of the caption is there
        hidden += int(masked[start : start + len(labels)].sum())
        kept += sum(1 for i, t in enumerate(labels) if not masked[start + i] and int(encoder_ids[start + i]) == t)
    total = sum(len(c) for c in task.captions) * 0.5
    assert 0.7 < hidden / total < 0.9 and kept / total < 0.2  # BERT's 80% [MASK] / 10% random / 10% kept
    assert not any(  # no fragment of 3+ tokens survives whole in the encoder input
        len(c) >= 6 and all(int(inputs["encoder_input_ids"][r, p]) == c[p] and not inputs["encoder_masked_tokens"][r, p]
                            for p in inputs["decoder_position_ids"][r][: (inputs["labels"][r] != -100).sum()].tolist())
        for r, c in enumerate(task.captions)
    )  # fmt: skip


def objective_inputs(objective, name, task):
    from itune_hf.training.pretraining import TASKS

    return TASKS[name].inputs[objective.family](task, objective.tokens, objective.masking)


@pytest.mark.parametrize("mode", ["single", "multi"])
def test_ida_replaces_each_span_by_one_mask_and_targets_the_whole_caption(processor, captions, mode):
    objective = objective_for(processor, masking=Masking(ida_masking=mode))
    batch = caption_batch(processor, captions[:20])
    task = objective.task_batch(batch)
    task.generators = objective.generators("ida", 0, 0, len(task.captions))
    inputs = objective_inputs(objective, "ida", task)
    assert torch.equal(inputs["labels"], batch["labels"]) and inputs["align_encoder_text"] is True
    for row, caption in enumerate(task.captions):
        length = int(inputs["encoder_attention_mask"][row].sum())
        masked = inputs["encoder_masked_tokens"][row][:length].tolist()
        runs = sum(1 for i, m in enumerate(masked) if m and (i == 0 or not masked[i - 1]))
        kept = [int(t) for t, m in zip(inputs["encoder_input_ids"][row][:length], masked) if not m]
        remaining = iter(caption)
        assert runs >= 1 and all(token in remaining for token in kept)  # the unmasked tokens, in order
        if mode == "single":
            assert sum(masked) == runs and len(kept) + runs == length <= len(caption)  # one [MASK] per span
        else:
            assert length == len(caption)


def test_the_same_example_draws_the_same_masks_and_other_epochs_other_ones(processor, captions):
    objective = objective_for(processor)
    task = objective.task_batch(caption_batch(processor, captions[:8]))

    def draw(epoch, first):
        task.generators = objective.generators("ida", epoch, first, len(task.captions))
        return objective_inputs(objective, "ida", task)["encoder_masked_tokens"]

    assert torch.equal(draw(0, 0), draw(0, 0)) and not torch.equal(draw(0, 0), draw(1, 0))
    objective.seed = 10**9  # a large seed: the generators' keys wrap into 64 bits (they overflowed past ~18,000)
    assert torch.equal(draw(0, 0), draw(0, 0))


def test_a_task_weight_scales_its_update_under_the_alternate_schedule(processor, captions):
    """lambda_task in the alternate schedule (one update per task): multiplying the loss did nothing, as the gradient
    is clipped to max_grad_norm and Adam divides its scale out. Each update is the task's step times its weight: one
    iteration (IC's update, then IMLM's from the same state) moves the weights linearly in IMLM's weight."""
    from types import SimpleNamespace

    from accelerate import Accelerator

    from itune_hf.training.loop import _train_micro_batch

    config = SimpleNamespace(task_schedule="alternate", max_grad_norm=1.0)
    batch = caption_batch(processor, captions[:4])
    torch.manual_seed(0)
    start = build_model(PRESET).eval().state_dict()
    moved = {}
    for weight in (1.0, 0.5, 0.25):
        model = build_model(PRESET).eval()
        model.load_state_dict(start)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98), weight_decay=0.01)
        accelerator = Accelerator(cpu=True)
        model, optimizer = accelerator.prepare(model, optimizer)
        objective = objective_for(processor, tasks="ic,imlm")
        objective.tasks = [("ic", 1.0), ("imlm", weight)]
        losses = _train_micro_batch(config, accelerator, model, optimizer, None, batch, objective, (0, 0))
        assert losses["loss"] == pytest.approx(losses["loss_ic"] + weight * losses["loss_imlm"])  # each task's own
        moved[weight] = torch.cat([(p.detach() - start[n]).flatten() for n, p in model.named_parameters()])
    half, quarter = moved[1.0] - moved[0.5], moved[0.5] - moved[0.25]  # IMLM's step, times 0.5 and 0.25
    assert half.norm() > 1e-3 and torch.allclose(half, 2 * quarter, atol=1e-6)


def test_task_options_are_checked(tmp_path):
    assert parse_tasks("IC, tifg", "1,0.3") == [("ic", 1.0), ("tifg", 0.3)]
    for tasks, weights, message in [("ic,mlm", None, "unknown task"), ("ic,ic", None, "twice"),
                                    ("ic,ida", "1", "expected 2"), ("ic", "x", "comma-separated numbers"),
                                    ("ic,ida", "1,0", "ida would have weight 0, which trains nothing")]:  # fmt: skip
        with pytest.raises(ValueError, match=message):
            TrainingConfig(output_dir=str(tmp_path), preset=PRESET, tasks=tasks, task_weights=weights)
    with pytest.raises(ValueError, match="gradient accumulation"):
        TrainingConfig(output_dir=str(tmp_path), preset=PRESET, tasks="ic,ida", gradient_accumulation_steps=2)


# ------------------------------------------------------------------------------------------------------------------
# TIFG: stop-gradient, and it learns
# ------------------------------------------------------------------------------------------------------------------
def test_tifg_target_gets_no_gradient_and_its_loss_falls(processor, captions):
    target = torch.randn(2, 3, 8, requires_grad=True)
    generated = torch.randn(2, 3, 8, requires_grad=True)
    tifg_loss(generated, target, torch.ones(2, 3)).backward()
    assert target.grad is None and generated.grad.abs().sum() > 0

    torch.manual_seed(0)
    model = build_model(PRESET)
    objective = objective_for(processor, tasks="tifg")
    task = objective.task_batch(caption_batch(processor, captions[:4]))
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=5e-3)
    losses = []
    for _ in range(8):
        loss = objective.loss("tifg", model, model, task, "cpu")
        optimizer.zero_grad()
        loss.backward()
        projection = model.model.encoder.region_embedding.projection.weight
        assert projection.grad is None  # the target's projection is never pushed to shrink
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0], losses


# ------------------------------------------------------------------------------------------------------------------
# Training: losses fall, resume mid-epoch, averaging
# ------------------------------------------------------------------------------------------------------------------
def run_config(world, output_dir, **overrides):
    options = dict(
        output_dir=str(output_dir), data=str(world), preset=PRESET, batch_size=2, max_steps=6, report_to="none",
        eval_split=None, tasks=TASKS, learning_rate=2e-3, log_every=3, save_every=3, seed=1,
    )  # fmt: skip
    return TrainingConfig(**{**options, **overrides})


@pytest.fixture(scope="module")
def straight_run(world, tmp_path_factory):
    out = tmp_path_factory.mktemp("pretrain-straight")
    return out, train(run_config(world, out))


def test_each_task_loss_falls_and_is_logged(straight_run):
    _, summary = straight_run
    logs = [h for h in summary["history"] if "loss" in h]
    for task in ("ic", "imlm", "ida"):
        assert logs[-1][f"loss_{task}"] < logs[0][f"loss_{task}"], (task, logs)
    assert "loss_tifg" in logs[0] and logs[0]["loss"] == pytest.approx(
        sum(logs[0][f"loss_{t}"] for t in ("ic", "imlm", "ida", "tifg")), abs=1e-3
    )


def test_resume_mid_epoch_equals_the_uninterrupted_run(straight_run, world, tmp_path):
    straight, _ = straight_run
    cut = tmp_path / "cut"
    shutil.copytree(straight, cut)  # the run as a crash after step 3 (of a 30-batch epoch) leaves it
    shutil.rmtree(cut / "checkpoints" / "step-0000006")
    (cut / "model.safetensors").unlink()
    train(run_config(world, cut, resume=True))
    a, b = load_file(straight / "model.safetensors"), load_file(cut / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_average_checkpoints_command_writes_the_mean_model(straight_run, tmp_path):
    straight, _ = straight_run
    out = tmp_path / "avg"
    assert main(["average-checkpoints", str(straight), "--output-dir", str(out), "--top", "2"]) == 0
    first, second = (
        load_file(straight / "checkpoints" / s / "model.safetensors") for s in ("step-0000003", "step-0000006")
    )
    averaged = load_file(out / "model.safetensors")
    key = "model.encoder.text.alignment_weight"
    assert torch.allclose(averaged[key], (first[key] + second[key]) / 2)
    assert json.loads((out / "averaged_from.json").read_text())["checkpoints"] == ["step-0000006", "step-0000003"]
    assert main(["average-checkpoints", str(tmp_path), "--output-dir", str(out)]) == 2  # not a run


# ------------------------------------------------------------------------------------------------------------------
# I-Tuning: prefix-LM tasks; TIFG refused
# ------------------------------------------------------------------------------------------------------------------
def test_ituning_imlm_and_ida_are_prefix_lm_objectives(captions):
    itune_processor = build_processor("itune-tiny-random")
    objective = objective_for(itune_processor, family="ituning", tasks="ic,imlm,ida")
    task = objective.task_batch(caption_batch(itune_processor, captions[:4]))
    task.generators = objective.generators("imlm", 0, 0, len(task.captions))
    inputs = objective_inputs(objective, "imlm", task)
    for row, caption in enumerate(task.captions):
        labels = inputs["labels"][row][inputs["labels"][row] != -100].tolist()
        assert labels[-1] == itune_processor.eos_token_id and " ".join(map(str, labels[:-1])) in " ".join(
            map(str, caption)
        )  # the fragment, then EOS; the corrupted caption is an unscored prompt
        ids = inputs["decoder_input_ids"][row].tolist()
        assert list(objective.tokens.prefix_mask) == ids[ids.index(objective.tokens.prefix_mask[0]):][
            : len(objective.tokens.prefix_mask)]  # fmt: skip
    model = build_model("itune-tiny-random")
    for name in ("imlm", "ida"):
        task.generators = objective.generators(name, 0, 0, len(task.captions))
        assert torch.isfinite(objective.loss(name, model, model, task, "cpu"))
    long = objective.task_batch(caption_batch(itune_processor, [" ".join(["a red star and a blue circle"] * 9)]))
    assert long.batch["decoder_input_ids"].shape[1] <= itune_processor.max_caption_length  # fits the processor...
    long.generators = objective.generators("imlm", 0, 0, 1)
    with pytest.raises(ValueError, match=r"--tasks imlm: its prompt and target take \d+ tokens, more than .* 128"):
        objective.loss("imlm", model, model, long, "cpu")  # ...not the LM's 128 positions once masked (IndexError)


def test_tifg_is_refused_for_ituning_with_the_reason(world, tmp_path, capsys):
    code = main(["train", "--preset", "itune-tiny-random", "--data", str(world), "--output-dir", str(tmp_path / "r"),
                 "--tasks", "ic,tifg", "--max-steps", "1", "--eval-split", "none", "--report-to", "none"])  # fmt: skip
    assert code == 2
    assert "no gradient can reach" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------------------------
# The alt-text world
# ------------------------------------------------------------------------------------------------------------------
def test_alt_text_world_has_other_objects_and_short_noisy_captions(tmp_path):
    assert main(["make-synthetic", "--output-dir", str(tmp_path / "alt"), "--num-images", "30", "--world",
                 "alt-text", "--image-size", "32"]) == 0  # fmt: skip
    data = json.loads((tmp_path / "alt" / "dataset.json").read_text())
    shapes = {o["shape"] for image in data["images"] for o in image["objects"]}
    assert shapes - set(SHAPES) and shapes <= set(ALT_TEXT_SHAPES)  # shapes the captions world never shows
    texts = [s["raw"] for image in data["images"] for s in image["sentences"]]
    assert max(len(t.split()) for t in texts) <= 7 and not any(t.endswith(".") for t in texts)
    unrelated = sum(
        not any(o["shape"] in s["raw"] or o["color"] in s["raw"] for o in image["objects"])
        for image in data["images"] for s in image["sentences"]
    )  # fmt: skip
    assert 0 < unrelated < len(texts) / 2
    assert data["generator"]["world"] == "alt-text"

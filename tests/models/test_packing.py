"""Padding-free caption batches (`itune_hf.models.ituning.packing`): the caption loss of a padded batch is computed on
its real tokens packed into a few rows, with the same loss, logits (on real tokens) and gradients as the padded
batch, and only where a probe finds that the LM keeps packed captions apart."""

from __future__ import annotations

import pytest
import torch
from peft import get_peft_model
from test_decoder_architectures import TINY_DECODERS, tiny_decoder_config

from itune_hf import ITuningAdapterConfig, ITuningConfig, ITuningForCaptioning
from itune_hf.models.ituning.packing import PackedCaptions, first_fit

from conftest import VOCAB, random_batch, tiny_model, tiny_vision_config

LENGTHS = [7, 3, 5, 1, 6]


def padded_batch(lengths=LENGTHS, left: bool = False, seed: int = 1):
    pixel_values, ids = random_batch(batch=len(lengths), length=max(lengths), seed=seed)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        if left:
            mask[row, mask.shape[1] - length :] = 1
        else:
            mask[row, :length] = 1
    labels = torch.roll(ids, -1, dims=1).masked_fill(mask == 0, -100)
    return pixel_values, ids.masked_fill(mask == 0, 2), mask, labels


def randomise_modules(model) -> None:
    """Non-zero I-Tuning modules (fresh ones add nothing), so that they matter in the comparison."""
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.2)


def loss_logits_grads(model, base, batch, packs):
    """One forward and backward with packing forced on or off (`base._packing_checked`)."""
    pixel_values, ids, mask, labels = batch
    base._packing_checked = packs
    model.zero_grad()
    out = model(pixel_values=pixel_values, decoder_input_ids=ids, decoder_attention_mask=mask, labels=labels)
    out.loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}
    return out.loss.detach(), out.logits.detach(), grads


def assert_packing_changes_nothing(model, base, batch) -> None:
    padded = loss_logits_grads(model, base, batch, False)
    packed = loss_logits_grads(model, base, batch, True)
    real = batch[2].bool()
    torch.testing.assert_close(packed[0], padded[0], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(packed[1][real], padded[1][real], atol=1e-5, rtol=1e-4)
    assert not packed[1][~real].any()  # the logits come back in the batch's layout, zero on padding
    for name in padded[2]:
        torch.testing.assert_close(packed[2][name], padded[2][name], atol=1e-6, rtol=1e-4, msg=name)


def test_captions_pack_first_fit_into_rows_each_numbered_from_zero_and_unpack_back():
    assert first_fit([7, 3, 5, 1, 6], capacity=8) == ([8, 6, 8], [(0, 0), (2, 5), (2, 0), (0, 7), (1, 0)])
    for left in (False, True):
        _, ids, mask, _ = padded_batch(left=left)
        packing = PackedCaptions.of(mask)
        packed = packing.pack(ids, fill=-1)
        assert packing.rows * packing.capacity >= sum(LENGTHS) and int((packed != -1).sum()) == sum(LENGTHS)
        torch.testing.assert_close(packing.unpack(packed), ids.masked_fill(mask == 0, 0))
        for row, length in enumerate(LENGTHS):  # each caption: one run of its row, positions 0..length-1
            slots = packing.slot[mask.reshape(-1).nonzero().squeeze(-1).tolist().index(row * mask.shape[1] + (
                mask.shape[1] - length if left else 0))]  # fmt: skip
            columns = torch.arange(slots % packing.capacity, slots % packing.capacity + length)
            assert packing.position_ids[slots // packing.capacity, columns].tolist() == list(range(length))


@pytest.mark.parametrize("text", ["gpt2", "llama"])
def test_the_packed_batch_gives_the_padded_batchs_loss_logits_and_gradients(text):
    model = tiny_model(text=text)
    randomise_modules(model)
    batch = padded_batch()
    model(pixel_values=batch[0], decoder_input_ids=batch[1], decoder_attention_mask=batch[2], labels=batch[3])
    assert model._packing_checked is True  # the probe found that this LM keeps packed captions apart
    assert_packing_changes_nothing(model, model, batch)
    assert_packing_changes_nothing(model, model, padded_batch(left=True))


def test_the_peft_adapter_packs_too():
    base = tiny_model(add_ituning_modules=False)
    model = get_peft_model(base, ITuningAdapterConfig(first_layer=1, init="random")).eval()
    randomise_modules(model)
    assert_packing_changes_nothing(model, base, padded_batch())


@pytest.mark.slow  # tracing forward and backward: about 15 s
def test_a_traced_step_runs_the_batch_padded_in_one_graph_with_the_packed_steps_loss_and_gradients():
    """Packing shapes a batch by its data, which a traced step (torch.compile) cannot follow: there the batch runs
    padded, in one graph (fullgraph: a graph break is an error), with the eager packed step's loss and gradients."""
    torch._dynamo.reset()
    model = tiny_model()
    randomise_modules(model)
    batch = padded_batch()
    packed = loss_logits_grads(model, model, batch, True)
    traced = torch.compile(model, backend="aot_eager", fullgraph=True, dynamic=True)
    calls = []
    original = model._packed_forward
    model._packed_forward = lambda *args, **kwargs: calls.append(1) or original(*args, **kwargs)
    got = loss_logits_grads(traced, model, batch, True)  # packing allowed, as after a successful probe
    assert calls == []
    real = batch[2].bool()
    torch.testing.assert_close(got[0], packed[0], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got[1][real], packed[1][real], atol=1e-5, rtol=1e-4)
    grads = {name.removeprefix("_orig_mod."): grad for name, grad in got[2].items()}  # the compiled wrapper's names
    assert grads.keys() == packed[2].keys()
    for name in packed[2]:
        torch.testing.assert_close(grads[name], packed[2][name], atol=1e-6, rtol=1e-4, msg=name)
    torch._dynamo.reset()


@pytest.mark.parametrize("model_type", list(TINY_DECODERS))
def test_every_decoder_packs_exactly_or_is_left_padded(model_type):
    config = ITuningConfig(
        vision_config=tiny_vision_config().to_dict(), text_config=tiny_decoder_config(model_type).to_dict()
    )
    torch.manual_seed(0)
    model = ITuningForCaptioning(config).eval()
    randomise_modules(model)
    batch = padded_batch()
    padded = loss_logits_grads(model, model, batch, False)[0]
    model._packing_checked = None  # the probe decides
    out = model(pixel_values=batch[0], decoder_input_ids=batch[1], decoder_attention_mask=batch[2], labels=batch[3])
    assert model._packing_checked in (True, False)
    torch.testing.assert_close(out.loss, padded, atol=1e-6, rtol=1e-5)


def test_an_lm_whose_masks_ignore_packing_is_left_padded(monkeypatch):
    import transformers.masking_utils as masking_utils

    monkeypatch.setattr(masking_utils, "find_packed_sequence_indices", lambda position_ids: None)
    model = tiny_model(text="llama")
    randomise_modules(model)
    batch = padded_batch()
    out = model(pixel_values=batch[0], decoder_input_ids=batch[1], decoder_attention_mask=batch[2], labels=batch[3])
    assert model._packing_checked is False  # the probe saw the captions attend to each other
    model._packing_checked = False
    torch.testing.assert_close(out.loss, loss_logits_grads(model, model, batch, False)[0])


def test_no_packing_for_labels_on_padding_checkpointed_layers_or_unpadded_batches():
    model = tiny_model()
    randomise_modules(model)
    pixel_values, ids, mask, labels = padded_batch()
    model._packing_checked = True
    calls = []
    original = model._packed_forward
    model._packed_forward = lambda *args, **kwargs: calls.append(1) or original(*args, **kwargs)
    model(pixel_values=pixel_values, decoder_input_ids=ids, decoder_attention_mask=mask, labels=ids)  # labels on pads
    model(pixel_values=pixel_values, decoder_input_ids=ids, decoder_attention_mask=torch.ones_like(mask), labels=labels)
    model(pixel_values=pixel_values, decoder_input_ids=ids, decoder_attention_mask=mask)  # no labels: no loss
    assert calls == []
    model(pixel_values=pixel_values, decoder_input_ids=ids, decoder_attention_mask=mask, labels=labels)
    assert calls == [1]
    model.gradient_checkpointing_enable()
    model.train()
    model(pixel_values=pixel_values, decoder_input_ids=ids, decoder_attention_mask=mask, labels=labels)
    assert calls == [1]
    assert VOCAB > 9  # the probe's token ids 5..9 exist in the tiny vocabulary

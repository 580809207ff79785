"""XGPT's generative pre-training tasks (Xia et al., section 4.3, eq. 2-5; appendix A.2) as `itune train --tasks`.

One registry entry per task (`TASKS`); each builds its inputs from a training micro-batch (the image inputs and the
tokenised captions the collator made for captioning) and returns its loss:

* ``ic``: the caption from the image (eq. 2): the batch as it is.
* ``imlm``: the caption with one fragment masked (MASS-style, `imlm_fraction` of its tokens, 50% as in appendix A.2;
  each masked token is [MASK] 80% of the time, a random token 10%, unchanged 10%) enters the encoder after the regions;
  the decoder generates only the fragment (eq. 3), at the fragment's positions.
* ``ida``: spans (lengths Poisson(`ida_span_mean`=3), `ida_mask_ratio`=30% of the tokens as BART) are each replaced
  by **one** [MASK] (`ida_masking="multi"`: one per token, the paper's Table 4 comparison); the encoder reads the
  regions and the infilled caption through the attention-driven matching; the decoder rebuilds the whole caption.
* ``tifg``: the encoder reads the caption alone; the decoder, fed one query per region (zero input, its position, a
  fixed sinusoidal code of the region index, no target features: nothing of the target leaks in), outputs N vectors
  regressed onto the regions' projected representation with eq. 5's loss, (1/N) sum_i ||x_i - x̄_i||_2^2: the
  squared distance *summed* over the h dimensions, averaged over the real regions. (A loss averaged over the
  dimensions as well is eq. 5 with lambda_TIFG / h: `--task-weights` sets that weight, e.g. 1/768 for h = 768.) The
  target carries no gradient (stop-gradient): without it the loss falls by shrinking the projection.

Masks come from a generator seeded by (seed, epoch, the example's position in the epoch, task), so a resumed run draws
the same masks (`--resume` stays bit-exact) and no global random state is consumed.

For I-Tuning (whose LM is frozen and reads the image through its modules), ``ic``, ``imlm`` and ``ida`` are prefix-LM
objectives through the processor's prompt masking: the corrupted caption is a prompt (no loss on it, placeholder
text for [MASK]), the fragment or the caption its continuation. ``tifg`` is refused: its input is text only, so no
gradient can reach an I-Tuning module.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

#: The keys of a micro-batch that carry its text (the rest are the image inputs).
TEXT_KEYS = ("decoder_input_ids", "decoder_attention_mask", "labels")
#: Placeholder text of [MASK] in an I-Tuning prompt (its frozen LM has no mask token) and the prompt's end.
PREFIX_MASK_TEXT, PREFIX_SEPARATOR_TEXT = " [MASK]", " ->"


@dataclass(frozen=True)
class Masking:
    """How the text tasks corrupt captions (appendix A.2; the rates it leaves open are chosen here).

    Args:
        imlm_fraction: Share of a caption's tokens in IMLM's one fragment (MASS: 0.5).
        ida_mask_ratio: Share of a caption's tokens IDA masks (BART: 0.3).
        ida_span_mean: Mean of the Poisson span lengths of IDA (3).
        ida_masking: `"single"`: one [MASK] per span (the paper's choice); `"multi"`: one per token.
    """

    imlm_fraction: float = 0.5
    ida_mask_ratio: float = 0.3
    ida_span_mean: float = 3.0
    ida_masking: str = "single"


@dataclass
class TaskBatch:
    """A micro-batch as the tasks see it.

    Args:
        images: The image inputs (every key but the text's).
        captions: Each row's caption tokens (no BOS/EOS).
        starts: Each row's decoder start tokens (BOS, and I-Tuning's caption prefix).
        batch: The micro-batch itself (IC uses it unchanged).
        generators: One random generator per row (see `example_generators`).
    """

    images: dict[str, torch.Tensor]
    captions: list[list[int]]
    starts: list[list[int]]
    batch: dict[str, torch.Tensor]
    generators: list[torch.Generator] = field(default_factory=list)


@dataclass(frozen=True)
class Tokens:
    """The token ids the tasks need: `bos`, `eos`, `pad`, the vocabulary size (random replacements) and I-Tuning's
    placeholder ids for [MASK] and the end of a prompt."""

    bos: int
    eos: int
    pad: int
    vocab_size: int
    prefix_mask: tuple[int, ...] = ()
    separator: tuple[int, ...] = ()


# ----------------------------------------------------------------------------------------------------------------
# Masking
# ----------------------------------------------------------------------------------------------------------------
def example_generators(seed: int, epoch: int, first_position: int, count: int, task: str) -> list[torch.Generator]:
    """One generator per example, seeded by (seed, epoch, the example's position in the epoch, task).

    Args:
        seed: The run's seed.
        epoch: The epoch under way.
        first_position: The position in the epoch's order of the first example of the micro-batch.
        count: Examples in the micro-batch.
        task: The task drawing (each task draws its own masks).
    """
    task_code = sum((index + 1) * ord(char) for index, char in enumerate(task))
    # manual_seed takes 64 bits: the key wraps (seeds above about 18,000 overflowed them)
    return [
        torch.Generator().manual_seed(
            (((seed * 1_000_003 + epoch) * 1_000_033 + first_position + row) * 1009 + task_code) % (1 << 64)
        )
        for row in range(count)
    ]


def _uniform(generator: torch.Generator) -> float:
    return float(torch.rand((), generator=generator))


def mass_fragment(length: int, fraction: float, generator: torch.Generator) -> tuple[int, int]:
    """IMLM's fragment `[start, end)`: `max(1, round(fraction * length))` consecutive tokens at a random start."""
    size = min(length, max(1, round(fraction * length)))
    start = int(torch.randint(0, length - size + 1, (), generator=generator))
    return start, start + size


def bert_corruption(
    tokens: Sequence[int], positions: range, vocab_size: int, generator: torch.Generator
) -> tuple[list[int], list[bool]]:
    """The encoder's view of masked `positions` (BERT's rule, appendix A.2): [MASK] 80% of the time, a random token 10%,
    the token unchanged 10%. Returns the ids and the [MASK] flags."""
    ids, masked = list(tokens), [False] * len(tokens)
    for position in positions:
        draw = _uniform(generator)
        if draw < 0.8:
            masked[position] = True
        elif draw < 0.9:
            ids[position] = int(torch.randint(0, vocab_size, (), generator=generator))
    return ids, masked


def infilling_spans(length: int, ratio: float, span_mean: float, generator: torch.Generator) -> list[tuple[int, int]]:
    """IDA's spans `[start, end)`, sorted and apart: lengths from Poisson(`span_mean`) (at least 1), placed at random,
    until `round(ratio * length)` tokens (at least 1) are covered (BART's text infilling)."""
    budget, spans, covered = max(1, round(ratio * length)), [], [False] * length
    for _ in range(4 * length):  # placement attempts; a crowded short caption may end slightly under budget
        if budget <= 0:
            break
        span = int(torch.poisson(torch.tensor([span_mean]), generator=generator).item())
        span = min(max(1, span), budget, length)
        start = int(torch.randint(0, length - span + 1, (), generator=generator))
        near = covered[max(0, start - 1) : min(length, start + span + 1)]
        if any(near):  # overlapping or touching an earlier span: two [MASK]s must stand for two spans
            continue
        covered[start : start + span] = [True] * span
        spans.append((start, start + span))
        budget -= span
    return sorted(spans)


def infill(tokens: Sequence[int], spans: Sequence[tuple[int, int]], multi: bool) -> tuple[list[int], list[bool]]:
    """`tokens` with each span replaced by one [MASK] (or by one per token with `multi`): ids and [MASK] flags (the
    id under a flag is a placeholder, 0)."""
    ids, masked, cursor = [], [], 0
    for start, end in spans:
        ids += tokens[cursor:start]
        masked += [False] * (start - cursor)
        count = end - start if multi else 1
        ids += [0] * count
        masked += [True] * count
        cursor = end
    ids += tokens[cursor:]
    masked += [False] * (len(tokens) - cursor)
    return ids, masked


def masked_fraction(task: str, captions: Sequence[Sequence[int]], masking: Masking, seed: int = 0) -> float:
    """The share of caption tokens a task hides from the encoder, measured over `captions` (docs/xgpt.md reports it).

    Args:
        task: `"imlm"` (the fragment) or `"ida"` (the spans).
        captions: Token lists.
        masking: The masking settings.
        seed: Seed of the draws.
    """
    hidden = total = 0
    generators = example_generators(seed, 0, 0, len(captions), task)
    for tokens, generator in zip(captions, generators):
        if task == "imlm":
            start, end = mass_fragment(len(tokens), masking.imlm_fraction, generator)
            hidden += end - start
        else:
            spans = infilling_spans(len(tokens), masking.ida_mask_ratio, masking.ida_span_mean, generator)
            hidden += sum(end - start for start, end in spans)
        total += len(tokens)
    return hidden / total


# ----------------------------------------------------------------------------------------------------------------
# Padding
# ----------------------------------------------------------------------------------------------------------------
def _pad(rows: Sequence[Sequence[Any]], value: Any, dtype=torch.long) -> torch.Tensor:
    length = max(len(row) for row in rows)
    out = torch.full((len(rows), length), value, dtype=dtype)
    for index, row in enumerate(rows):
        if len(row):
            out[index, : len(row)] = torch.tensor(list(row), dtype=dtype)
    return out


def _lengths_mask(rows: Sequence[Sequence[Any]]) -> torch.Tensor:
    return _pad([[1] * len(row) for row in rows], 0)


def _sequences(starts, prompts, targets, tokens: Tokens) -> dict[str, torch.Tensor]:
    """Decoder inputs `[start, prompt, target]` with labels on the target and EOS (-100 elsewhere), right-padded."""
    inputs, labels = [], []
    for start, prompt, target in zip(starts, prompts, targets):
        inputs.append([*start, *prompt, *target])
        labels.append([-100] * (len(start) - 1 + len(prompt)) + [*target, tokens.eos])
    return {"decoder_input_ids": _pad(inputs, tokens.pad), "decoder_attention_mask": _lengths_mask(inputs),
            "labels": _pad(labels, -100)}  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------
# The tasks, for XGPT
# ----------------------------------------------------------------------------------------------------------------
def xgpt_ic_inputs(task: TaskBatch, tokens: Tokens, masking: Masking) -> dict[str, torch.Tensor]:
    """IC: the micro-batch as it is (regions in, caption out)."""
    return dict(task.batch)


def xgpt_imlm_inputs(task: TaskBatch, tokens: Tokens, masking: Masking) -> dict[str, torch.Tensor]:
    """IMLM: regions + the caption with one fragment masked in; the fragment out, at its positions (MASS)."""
    encoder_ids, encoder_masked, decoder_ids, labels, positions = [], [], [], [], []
    for caption, generator in zip(task.captions, task.generators):
        start, end = mass_fragment(len(caption), masking.imlm_fraction, generator)
        ids, masked = bert_corruption(caption, range(start, end), tokens.vocab_size, generator)
        encoder_ids.append(ids)
        encoder_masked.append(masked)
        fragment = caption[start:end]
        decoder_ids.append([tokens.bos, *fragment[:-1]])
        labels.append(fragment)
        positions.append(list(range(start, end)))
    return {
        **task.images,
        "encoder_input_ids": _pad(encoder_ids, tokens.pad),
        "encoder_attention_mask": _lengths_mask(encoder_ids),
        "encoder_masked_tokens": _pad(encoder_masked, False, torch.bool),
        "decoder_input_ids": _pad(decoder_ids, tokens.pad),
        "decoder_attention_mask": _lengths_mask(decoder_ids),
        "decoder_position_ids": _pad(positions, 0),
        "labels": _pad(labels, -100),
    }


def _infilled(task: TaskBatch, masking: Masking) -> tuple[list[list[int]], list[list[bool]]]:
    encoder_ids, encoder_masked = [], []
    for caption, generator in zip(task.captions, task.generators):
        spans = infilling_spans(len(caption), masking.ida_mask_ratio, masking.ida_span_mean, generator)
        ids, masked = infill(caption, spans, multi=masking.ida_masking == "multi")
        encoder_ids.append(ids)
        encoder_masked.append(masked)
    return encoder_ids, encoder_masked


def xgpt_ida_inputs(task: TaskBatch, tokens: Tokens, masking: Masking) -> dict[str, torch.Tensor]:
    """IDA: regions + the infilled caption (one [MASK] per span) through the image-text matching; the whole caption
    out."""
    encoder_ids, encoder_masked = _infilled(task, masking)
    return {
        **task.images,
        "encoder_input_ids": _pad(encoder_ids, tokens.pad),
        "encoder_attention_mask": _lengths_mask(encoder_ids),
        "encoder_masked_tokens": _pad(encoder_masked, False, torch.bool),
        "align_encoder_text": True,
        **{key: task.batch[key] for key in TEXT_KEYS},
    }


def region_index_code(count: int, width: int) -> torch.Tensor:
    """`(count, width)` fixed sinusoidal codes of region indices (Vaswani et al.'s), TIFG's per-region queries."""
    position = torch.arange(count, dtype=torch.float32)[:, None]
    frequency = torch.exp(torch.arange(0, width, 2, dtype=torch.float32) * (-math.log(10_000.0) / width))
    code = torch.zeros(count, width)
    code[:, 0::2] = torch.sin(position * frequency)
    code[:, 1::2] = torch.cos(position * frequency)[:, : width // 2]
    return code


def tifg_loss(generated: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Eq. 5 without its weight: (1/N) sum_i ||x_i - x̄_i||_2^2, the squared Euclidean distance of each generated
    vector to its target (summed over the hidden dimensions, as the norm is), averaged over the batch's real regions.
    The target is detached (stop-gradient: no gradient ever reaches it). The task's weight lambda_TIFG is
    `--task-weights`' (the paper: 1 out of domain, 0.3 in domain); averaging over the h dimensions instead amounts to
    a weight of lambda_TIFG / h.

    Args:
        generated: `(B, N, hidden)` the decoder's outputs.
        target: `(B, N, hidden)` the regions' representations.
        mask: `(B, N)` 1 for real regions.
    """
    errors = (generated.float() - target.detach().float()).pow(2).sum(dim=-1)
    weights = mask.to(errors.dtype)
    return (errors * weights).sum() / weights.sum().clamp(min=1.0)


def xgpt_tifg_loss(model, unwrapped, task: TaskBatch, tokens: Tokens, masking: Masking) -> torch.Tensor:
    """TIFG: the caption alone in; one vector per region out, regressed onto the regions' projected representation."""
    target, region_mask = unwrapped.model.encoder.region_targets(**task.images)
    batch, count, width = target.shape
    limit = unwrapped.config.max_position_embeddings
    queries = region_index_code(count, width).to(target)[None].expand(batch, -1, -1)
    positions = torch.arange(count, device=target.device).clamp(max=limit - 1)[None].expand(batch, -1)
    captions = task.captions
    outputs = model(
        encoder_input_ids=_pad(captions, tokens.pad).to(target.device),
        encoder_attention_mask=_lengths_mask(captions).to(target.device),
        decoder_inputs_embeds=queries,
        decoder_attention_mask=region_mask,
        decoder_position_ids=positions,
        output_hidden_states=True,
        logits_to_keep=1,
        use_cache=False,
    )
    return tifg_loss(outputs.decoder_hidden_states[-1], target, region_mask)


# ----------------------------------------------------------------------------------------------------------------
# The tasks, for I-Tuning (prefix-LM objectives)
# ----------------------------------------------------------------------------------------------------------------
def _prefix_prompt(ids: list[int], masked: list[bool], tokens: Tokens) -> list[int]:
    prompt = []
    for token, is_mask in zip(ids, masked):
        prompt += list(tokens.prefix_mask) if is_mask else [token]
    return [*prompt, *tokens.separator]


def ituning_imlm_inputs(task: TaskBatch, tokens: Tokens, masking: Masking) -> dict[str, torch.Tensor]:
    """IMLM as a prefix LM: the caption with a fragment masked is the prompt; the fragment (and EOS) the target."""
    prompts, targets = [], []
    for caption, generator in zip(task.captions, task.generators):
        start, end = mass_fragment(len(caption), masking.imlm_fraction, generator)
        ids, masked = bert_corruption(caption, range(start, end), tokens.vocab_size, generator)
        prompts.append(_prefix_prompt(ids, masked, tokens))
        targets.append(caption[start:end])
    return {**task.images, **_sequences(task.starts, prompts, targets, tokens)}


def ituning_ida_inputs(task: TaskBatch, tokens: Tokens, masking: Masking) -> dict[str, torch.Tensor]:
    """IDA as a prefix LM: the infilled caption is the prompt; the whole caption (and EOS) the target."""
    encoder_ids, encoder_masked = _infilled(task, masking)
    prompts = [_prefix_prompt(ids, masked, tokens) for ids, masked in zip(encoder_ids, encoder_masked)]
    return {**task.images, **_sequences(task.starts, prompts, task.captions, tokens)}


# ----------------------------------------------------------------------------------------------------------------
# The registry
# ----------------------------------------------------------------------------------------------------------------
InputsBuilder = Callable[[TaskBatch, Tokens, Masking], dict[str, Any]]


@dataclass(frozen=True)
class PretrainingTask:
    """One pre-training task.

    Args:
        name: Its `--tasks` name.
        title: What it is, in words.
        inputs: Per family, how it builds the model inputs of a micro-batch (the model's `.loss` is the task loss).
        loss: Per family, a loss function `(model, unwrapped, task_batch, tokens, masking)` instead of `inputs`.
        refused: Per family, why it cannot train that family.
    """

    name: str
    title: str
    inputs: dict[str, InputsBuilder] = field(default_factory=dict)
    loss: dict[str, Callable[..., torch.Tensor]] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)


TASKS: dict[str, PretrainingTask] = {}


def register_task(task: PretrainingTask) -> PretrainingTask:
    """Add a task to `TASKS` (its name becomes a `--tasks` value)."""
    TASKS[task.name] = task
    return task


register_task(PretrainingTask(
    "ic", "image captioning (eq. 2)", inputs={"xgpt": xgpt_ic_inputs, "ituning": xgpt_ic_inputs},
))  # fmt: skip
register_task(PretrainingTask(
    "imlm", "image-conditioned masked language modelling (eq. 3)",
    inputs={"xgpt": xgpt_imlm_inputs, "ituning": ituning_imlm_inputs},
))  # fmt: skip
register_task(PretrainingTask(
    "ida", "image-conditioned denoising autoencoding (eq. 4)",
    inputs={"xgpt": xgpt_ida_inputs, "ituning": ituning_ida_inputs},
))  # fmt: skip
register_task(PretrainingTask(
    "tifg", "text-conditioned image feature generation (eq. 5)", loss={"xgpt": xgpt_tifg_loss},
    refused={"ituning": (
        "TIFG reads text only and generates image features; I-Tuning's trainable modules sit between the image and "
        "the frozen language model, so with no image input no gradient can reach them (and the frozen LM cannot "
        "learn to output image features): drop tifg from --tasks for I-Tuning"
    )},
))  # fmt: skip


def parse_tasks(tasks: str, weights: str | None) -> list[tuple[str, float]]:
    """`--tasks` and `--task-weights` as `[(task, weight)]`.

    Args:
        tasks: Comma-separated task names (`ic,imlm,ida,tifg`).
        weights: Comma-separated weights, one per task (None: all 1).

    Raises:
        ValueError: an unknown or repeated task, weights of another count, a negative or non-numeric weight.
    """
    names = [name.strip().lower() for name in tasks.split(",") if name.strip()]
    if not names:
        raise ValueError(f"tasks={tasks!r} names no task; choose from {', '.join(TASKS)}")
    unknown = [name for name in names if name not in TASKS]
    if unknown:
        raise ValueError(f"tasks={tasks!r}: unknown task(s) {', '.join(unknown)}; choose from {', '.join(TASKS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"tasks={tasks!r} names a task twice")
    if weights is None:
        return [(name, 1.0) for name in names]
    try:
        values = [float(w) for w in weights.split(",")]
    except ValueError:
        raise ValueError(f"task_weights={weights!r}: expected comma-separated numbers, one per task") from None
    if len(values) != len(names) or any(v < 0 or not math.isfinite(v) for v in values):
        raise ValueError(
            f"task_weights={weights!r}: expected {len(names)} non-negative numbers, one per task of tasks={tasks!r}"
        )
    zero = [name for name, value in zip(names, values) if value == 0]
    if zero:
        raise ValueError(
            f"task_weights={weights!r}: {', '.join(zero)} would have weight 0, which trains nothing (yet an alternate "
            f"schedule would still step the optimizer for it): leave {'it' if len(zero) == 1 else 'them'} out of "
            f"tasks={tasks!r}"
        )
    return list(zip(names, values))


class Objective:
    """The run's weighted tasks for one model family; `loss` gives a task's (unweighted) loss on a micro-batch.

    A task's weight is lambda in the paper's weighted sum of losses: under `task_schedule="sum"` it multiplies the
    task's loss in the one update; under `"alternate"` (one update per task) it scales that task's update (its
    learning rate), as multiplying the loss would not: the gradient is clipped to `max_grad_norm` whatever its scale,
    and Adam divides the scale out.

    Args:
        tasks: `[(task name, weight)]` (see `parse_tasks`).
        family: The model family (`"xgpt"` or `"ituning"`).
        tokens: The token ids the tasks use.
        masking: The masking settings.
        seed: The run's seed (masks are drawn from (seed, epoch, example, task)).

    Raises:
        ValueError: a task that the family cannot train, with the reason.
    """

    def __init__(self, tasks, family: str, tokens: Tokens, masking: Masking, seed: int) -> None:
        for name, _ in tasks:
            task = TASKS[name]
            if family in task.refused:
                raise ValueError(f"--tasks {name}: {task.refused[family]}")
            if family not in task.inputs and family not in task.loss:
                raise ValueError(f"--tasks {name}: {task.title} is not defined for {family} models")
        self.tasks, self.family, self.tokens, self.masking, self.seed = list(tasks), family, tokens, masking, seed

    @classmethod
    def for_run(cls, config, family: str, processor) -> Objective:
        """The objective of a run (`config.tasks`, `task_weights`, the masking options) for `family`."""
        tokenizer = processor.tokenizer
        tokens = Tokens(
            bos=processor.bos_token_id, eos=processor.eos_token_id, pad=processor.pad_token_id,
            vocab_size=len(tokenizer),
            prefix_mask=tuple(tokenizer(PREFIX_MASK_TEXT, add_special_tokens=False)["input_ids"]),
            separator=tuple(tokenizer(PREFIX_SEPARATOR_TEXT, add_special_tokens=False)["input_ids"]),
        )  # fmt: skip
        return cls(parse_tasks(config.tasks, config.task_weights), family, tokens, config.masking, config.seed)

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.tasks]

    def task_batch(self, batch: dict[str, torch.Tensor]) -> TaskBatch:
        """Split a captioning micro-batch into image inputs, caption tokens and decoder start tokens."""
        labels, inputs = batch["labels"].cpu(), batch["decoder_input_ids"].cpu()
        captions, starts = [], []
        for row_labels, row_inputs in zip(labels, inputs):
            kept = (row_labels != -100).nonzero().flatten()
            first = int(kept[0])
            captions.append(row_labels[kept].tolist()[:-1] or [self.tokens.eos])  # without its EOS; never empty
            starts.append(row_inputs[: first + 1].tolist())
        images = {key: value for key, value in batch.items() if key not in TEXT_KEYS}
        return TaskBatch(images, captions, starts, batch)

    def loss(self, name: str, model, unwrapped, task: TaskBatch, device) -> torch.Tensor:
        """Task `name`'s unweighted loss on a micro-batch (`task.generators` drawn for it)."""
        entry = TASKS[name]
        if self.family in entry.loss:
            return entry.loss[self.family](model, unwrapped, task, self.tokens, self.masking)
        inputs = entry.inputs[self.family](task, self.tokens, self.masking)
        _check_positions(name, inputs["decoder_input_ids"].shape[1], unwrapped)
        inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        return model(**inputs).loss

    def generators(self, name: str, epoch: int, first_position: int, count: int) -> list[torch.Generator]:
        return example_generators(self.seed, epoch, first_position, count, name)


def _check_positions(task: str, length: int, model) -> None:
    """Refuse a task's decoder sequences longer than the LM's positions (I-Tuning's prefix-LM prompts spell each
    [MASK] in several tokens, so a caption within --max-caption-length can outgrow them)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    positions = getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int) and length > positions:
        raise ValueError(
            f"--tasks {task}: its prompt and target take {length} tokens, more than the language model's {positions} "
            "positions (each [MASK] of the prompt is spelled in several tokens): lower --max-caption-length"
        )


__all__ = [
    "Masking", "Objective", "PretrainingTask", "TASKS", "TaskBatch", "Tokens",
    "bert_corruption", "example_generators", "infill", "infilling_spans", "mass_fragment", "masked_fraction",
    "parse_tasks", "region_index_code", "register_task", "tifg_loss",
]  # fmt: skip

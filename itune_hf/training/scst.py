"""Self-critical sequence training (SCST; Rennie et al. 2017, "Self-critical Sequence Training for Image
Captioning"): `itune train --objective scst --init-model RUN`, the second stage after cross-entropy.

For each training caption's image the model samples `--scst-samples` captions (from the full distribution: no top-k,
temperature 1) and the loss is REINFORCE with a baseline,

    loss = - mean over samples of (reward - baseline) x log p(sampled caption),

log p summed over the caption's tokens, its end-of-sequence token included (a caption cut at the length limit has
none). The reward is a registered metric's per-image score (`--scst-reward`): CIDEr-D by default, with the document
frequencies of the training split's references computed once (as SCST does), or the `Objects` F1 of a generated
world. The baseline is the greedy caption's reward (`greedy`, the paper's) or the mean reward of the image's other
samples (`mean`, the "new SCST" of later implementations, which needs no greedy decoding).

Only what the run trains learns (I-Tuning: the adapter); the loop, checkpoints, `--resume` and `--time-budget` are
the training loop's (`loop.py` asks this module for the micro-batch's loss). Sampling draws from torch's generator,
which checkpoints save, so a resumed run samples what the uninterrupted one would. The policy is sampled and scored
without dropout (the same distribution the gradient is taken of).

The known pitfall (captions that end in "a", "with", ...: CIDEr-D's n-grams do not see the end of the caption) is
handled three ways: the n-gram rewards read a finished caption's end as a word `<eos>` (`--scst-count-eos`, on by
default; the references end with it too, so "with a <eos>" matches nothing), `--scst-ending-penalty` lowers the reward
of such captions, and the rate is logged every `--log-every` steps (`train/bad_endings` for the samples,
`train/greedy_bad_endings` for the greedy captions).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from .config import reward_metric

#: Words a caption should not end with (articles, prepositions, conjunctions): an ending in one is SCST's pitfall.
FUNCTION_WORDS = frozenset("a an the with of on in and to at for by from or its their is are as into onto".split())
#: The word the n-gram rewards read at the end of a finished caption (`--scst-count-eos`).
END_WORD = "<eos>"
#: Keys of the batch that are not model inputs: the caption's image (its row in the training split), and the labels.
_NOT_VISUAL = ("image_rows", "labels")


def ends_in_function_word(tokens: str) -> bool:
    """Whether a tokenised caption (words separated by spaces, as PTB tokenisation leaves it) ends in a function
    word (`FUNCTION_WORDS`).

    Args:
        tokens: The caption's tokens.
    """
    words = tokens.split()
    return bool(words) and words[-1] in FUNCTION_WORDS


def self_critical_loss(log_probs: torch.Tensor, rewards: torch.Tensor, baselines: torch.Tensor) -> torch.Tensor:
    """REINFORCE with a baseline: `-mean((reward - baseline) * log p)`; a sample rewarded above its baseline has its
    log-probability raised by a descent step, one below it lowered.

    Args:
        log_probs: Each sampled caption's log-probability (summed over its tokens), with gradient.
        rewards: Each sample's reward.
        baselines: Each sample's baseline.
    """
    advantage = (rewards - baselines).to(log_probs)
    return -(advantage * log_probs).mean()


def caption_mask(
    sequences: torch.Tensor, prompt_length: int, eos_ids: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which generated tokens each caption has (up to and including its first end-of-sequence token; what follows is
    padding), and whether it finished (has one).

    Args:
        sequences: `generate`'s output, `(captions, prompt_length + new tokens)`.
        prompt_length: Tokens of the prompt before the generated ones.
        eos_ids: The end-of-sequence token ids.

    Returns:
        `(mask, finished)`: a bool mask of `sequences`' shape (the prompt excluded), a bool per caption.
    """
    generated = sequences[:, prompt_length:]
    is_end = torch.isin(generated, torch.tensor(list(eos_ids), device=sequences.device))
    ended_before = (is_end.long().cumsum(dim=1) - is_end.long()) > 0  # an end-of-sequence token came earlier
    mask = torch.zeros_like(sequences, dtype=torch.bool)
    mask[:, prompt_length:] = ~ended_before
    return mask, is_end.any(dim=1)


def sequence_log_probs(logits: torch.Tensor, sequences: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each caption's log-probability: the sum over its tokens (`mask`) of the log-probability the logits of the
    position before gave it.

    Args:
        logits: `(captions, length, vocabulary)`, position t predicting token t + 1 of `sequences`.
        sequences: The captions' tokens, prompt first, `(captions, length)`.
        mask: The tokens to count (see `caption_mask`).
    """
    targets = sequences[:, 1:]
    token_log_probs = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return (token_log_probs * mask[:, 1:]).sum(dim=1)


class SelfCritical:
    """The SCST objective of a run: samples captions, scores them and gives the micro-batch's loss.

    Args:
        config: The run's settings (`scst_*`, `max_caption_length`: the longest sampled caption, BOS and EOS
            included).
        processor: The model's processor (the generation prompt; decoding).
        references: Each training image's reference captions, by its row in the training split.
        scenes: Each training image's recorded scene by row (for a scene reward), or None.

    Raises:
        ValueError: a scene reward without scenes for every training image.
    """

    def __init__(self, config, processor, references: Sequence[Sequence[str]], scenes: Sequence[Any] | None = None):
        from ..metrics import DocumentFrequency, tokenize_captions

        self.config, self.processor = config, processor
        self.metric, self.key = reward_metric(config.scst_reward)
        if self.metric.needs_scenes and (scenes is None or not all(self.metric.reads(scene) for scene in scenes)):
            raise ValueError(
                f"--scst-reward {config.scst_reward}: {config.data} has no recorded scene for every training image "
                f"that {self.metric.name} reads (a generated world's dataset.json records objects: itune "
                "make-synthetic; an itune make-clipart one content words); choose CIDEr"
            )
        self.scenes = scenes
        # the end of a caption is a word for the n-gram rewards; the scene metrics read the caption's grammar
        self.end_word = config.scst_count_eos and not self.metric.needs_scenes
        flat = tokenize_captions([caption for refs in references for caption in refs])
        words = iter(flat)
        self.references = [[self._ended(next(words)) for _ in refs] for refs in references]
        self.document_frequency = DocumentFrequency.from_references(self.references)
        self.max_new_tokens = config.max_caption_length - 1  # the prompt's BOS is the first token

    @classmethod
    def for_run(cls, config, processor, rows, num_images: int) -> SelfCritical:
        """The objective of a run training on `rows` (the training split; its first `num_images` are used).

        Args:
            config: The run's settings.
            processor: The model's processor.
            rows: The training split (`image_id`, `captions`).
            num_images: How many of its images the run trains on.
        """
        used = rows.select(range(num_images)) if num_images < len(rows) else rows
        scenes = None
        if reward_metric(config.scst_reward)[0].needs_scenes:
            from ..data.scenes import scenes_of_data

            recorded = scenes_of_data(config.data) or {}
            scenes = [recorded.get(image_id) for image_id in used["image_id"]]
        return cls(config, processor, list(used["captions"]), scenes)

    def _ended(self, tokens: str, finished: bool = True) -> str:
        return f"{tokens} {END_WORD}".strip() if self.end_word and finished else tokens

    def rewards(self, captions: Sequence[str], rows: Sequence[int], finished: Sequence[bool]) -> tuple[list, list]:
        """Each caption's reward against its image's references, and whether it ends in a function word.

        Args:
            captions: Decoded captions.
            rows: Each caption's image (its row in the training split).
            finished: Whether each caption ended with an end-of-sequence token (not cut at the length limit).

        Returns:
            `(rewards, bad_endings)`: floats (the ending penalty subtracted) and bools, one per caption.
        """
        from ..metrics import CaptionScorer, tokenize_captions

        tokens = tokenize_captions(captions)
        bad = [ends_in_function_word(caption) for caption in tokens]
        hypotheses = {i: self._ended(caption, done) for i, (caption, done) in enumerate(zip(tokens, finished))}
        references = {i: self.references[row] for i, row in enumerate(rows)}
        scenes = None if self.scenes is None else {i: self.scenes[row] for i, row in enumerate(rows)}
        scorer = CaptionScorer([self.metric.name], idf_corpus=self.document_frequency, tokenized=True)
        scores = scorer.score(hypotheses, references, scenes=scenes)
        if isinstance(scores.scores.get(self.key), str):  # "unavailable: <reason>"
            raise ValueError(f"--scst-reward {self.config.scst_reward}: {scores.scores[self.key]}")
        penalty = self.config.scst_ending_penalty
        # an image the metric cannot grade (NaN: a clip-art record naming no content word) gives every sample and
        # the baseline 0, so no signal but the ending penalty, instead of a NaN that would poison the step
        graded = [scores.per_image[i][self.key] for i in range(len(tokens))]
        return [(0.0 if math.isnan(score) else score) - penalty * bad[i] for i, score in enumerate(graded)], bad

    def loss(self, model, unwrapped, batch: dict[str, Any], accelerator) -> tuple[torch.Tensor, dict[str, float]]:
        """The micro-batch's SCST loss (with gradient, through the prepared `model`) and what to log: the mean reward
        of the samples, the baseline's, the greedy captions' (greedy baseline) and the rates of endings in a function
        word.

        Args:
            model: The model as the run prepared it (DDP-wrapped under several processes).
            unwrapped: The same model unwrapped (for `generate`).
            batch: The collated micro-batch, with `image_rows`.
            accelerator: The run's `Accelerator`.
        """
        count, k = len(batch["image_rows"]), self.config.scst_samples
        rows = [int(row) for row in batch["image_rows"].tolist()]
        prompt = {name: value.to(accelerator.device) for name, value in self.processor(text=[None] * count).items()}
        visual = {name: value for name, value in batch.items() if name not in (*_NOT_VISUAL, *prompt)}
        was_training = model.training
        model.eval()  # the policy is sampled, and its gradient taken, without dropout
        try:
            samples = self._generate(unwrapped, visual, prompt, k, accelerator, sample=True)
            sampled_rows = [row for row in rows for _ in range(k)]
            stats: dict[str, float] = {}
            rewards, bad = self.rewards(samples.captions, sampled_rows, samples.finished.tolist())
            baselines = self._baselines(unwrapped, visual, prompt, rewards, rows, accelerator, stats)
            visual_k = {name: _repeat(value, k) for name, value in visual.items()}
            text = {name: samples.attention_mask if "attention_mask" in name else samples.sequences for name in prompt}
            logits = model(**visual_k, **text).logits
        finally:
            model.train(was_training)
        log_probs = sequence_log_probs(logits, samples.sequences, samples.mask)
        rewards_t = torch.tensor(rewards, device=log_probs.device)
        loss = self_critical_loss(log_probs, rewards_t, torch.tensor(baselines, device=log_probs.device))
        stats.update(reward=float(rewards_t.mean()), baseline=sum(baselines) / len(baselines),
                     bad_endings=sum(bad) / len(bad), finished=float(samples.finished.float().mean()))  # fmt: skip
        return loss, stats

    def _baselines(self, unwrapped, visual, prompt, rewards: list, rows: list, accelerator, stats: dict) -> list:
        """Each sample's baseline: its image's greedy caption's reward, or the mean of the image's other samples'."""
        k = self.config.scst_samples
        if self.config.scst_baseline == "mean":
            baselines = []
            for start in range(0, len(rewards), k):
                group = rewards[start : start + k]
                baselines += [(sum(group) - reward) / (k - 1) for reward in group]
            return baselines
        greedy = self._generate(unwrapped, visual, prompt, 1, accelerator, sample=False)
        greedy_rewards, greedy_bad = self.rewards(greedy.captions, rows, greedy.finished.tolist())
        stats.update(greedy=sum(greedy_rewards) / len(rows), greedy_bad_endings=sum(greedy_bad) / len(rows))
        return [reward for reward in greedy_rewards for _ in range(k)]

    @torch.no_grad()
    def _generate(self, unwrapped, visual, prompt, k: int, accelerator, *, sample: bool) -> _Captions:
        """`k` sampled captions per image (from the full distribution), or the greedy caption (k = 1)."""
        inputs = {name: _repeat(value, k) for name, value in {**visual, **prompt}.items()}
        # sampling from the whole distribution (a model's generation config may ask for top-k or beams: not here)
        decoding = {"do_sample": True, "top_k": 0, "top_p": 1.0, "temperature": 1.0} if sample else {"do_sample": False}
        with accelerator.autocast():
            sequences = unwrapped.generate(
                **inputs, **decoding, num_beams=1, max_new_tokens=self.max_new_tokens, use_cache=True
            )
        prompt_length = next(iter(prompt.values())).shape[1]
        eos = unwrapped.generation_config.eos_token_id
        mask, finished = caption_mask(sequences, prompt_length, eos if isinstance(eos, list) else [eos])
        attention_mask = mask.clone()
        attention_mask[:, :prompt_length] = True
        captions = self.processor.batch_decode(sequences)
        return _Captions(sequences, mask, attention_mask.long(), finished, captions)


class _Captions(NamedTuple):
    """Generated captions: their tokens, the tokens that count, the attention mask, whether each finished, the text."""

    sequences: torch.Tensor
    mask: torch.Tensor
    attention_mask: torch.Tensor
    finished: torch.Tensor
    captions: list[str]


def _repeat(value: Any, k: int) -> Any:
    """A batch input with each image's entry repeated `k` times in a row."""
    if k == 1:
        return value
    if isinstance(value, torch.Tensor):
        return value.repeat_interleave(k, dim=0)
    if isinstance(value, list):
        return [entry for entry in value for _ in range(k)]
    raise TypeError(f"cannot repeat a batch input of type {type(value).__name__} per sample")


__all__ = [
    "END_WORD",
    "FUNCTION_WORDS",
    "SelfCritical",
    "caption_mask",
    "ends_in_function_word",
    "reward_metric",
    "self_critical_loss",
    "sequence_log_probs",
]

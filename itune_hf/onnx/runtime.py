"""Captioning with onnxruntime from an exported directory (`itune export --format onnx`; `itune caption --runtime
onnx`): the image graph once per batch (I-Tuning's vision tower, XGPT's encoder), then the decoder step by step with
its KV cache, reading what the image graph gave, greedy or beam search.

Greedy decoding is the torch model's: the most likely token at each step, the padding token after the end-of-text
token, at most `max_new_tokens`. Beam search follows transformers' rules (scores summed log-probabilities, a finished
caption scored by its length to the power 1, a batch done once no running beam can beat its finished ones), so its
captions agree with torch's up to the numerics of near ties (benchmarks/RESULTS.md has the agreement).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError


def require_onnxruntime():
    """The `onnxruntime` module, or an error saying how to install it.

    Raises:
        InputError: when onnxruntime is not installed.
    """
    try:
        import onnxruntime
    except ImportError as error:
        raise InputError(
            f"the ONNX runtime needs onnxruntime ({error}); install it with pip install 'itune-hf[onnx]', or caption "
            "with --runtime torch"
        ) from None
    return onnxruntime


class OnnxCaptioner:
    """An exported captioner run by onnxruntime on the CPU.

    An export with a vocabulary shortlist runs its decoder in the shortlist's ids: the prompt and the special tokens
    are translated to them, and the captions back to the tokenizer's, so `generate` speaks tokenizer ids either way.

    Args:
        directory: What `itune_hf.onnx.export.export_onnx` wrote.
        threads: Intra-op threads (default: onnxruntime's).
        int8: Which decoder to run: None (default) the export's (its int8 one when exported with `--quantize
            int8`), False its fp32 `decoder.onnx`, True its `decoder.int8.onnx`.

    Raises:
        InputError: naming the directory, when it is not an export, is newer than this version reads, lacks the int8
            decoder asked for, or a graph cannot be read; or when onnxruntime is missing.
    """

    def __init__(self, directory: str | os.PathLike, *, threads: int | None = None, int8: bool | None = None) -> None:
        from ..utils.files import read_json
        from .export import CONFIG_NAME, FORMAT, FORMAT_VERSION

        ort = require_onnxruntime()
        self.directory = Path(directory)
        config_path = self.directory / CONFIG_NAME
        if not config_path.is_file():
            raise InputError(
                f"--model {directory}: no {CONFIG_NAME}, so not an ONNX export; write one with itune export --model M "
                "--format onnx --output-dir DIR, or caption a checkpoint with --runtime torch"
            )
        self.config = read_json(config_path, "the ONNX export's config")
        if self.config.get("format") != FORMAT:
            raise InputError(f"{config_path}: format {self.config.get('format')!r}, expected {FORMAT!r}")
        if self.config.get("format_version", 1) > FORMAT_VERSION:
            raise InputError(
                f"{config_path}: format version {self.config['format_version']}, newer than this itune_hf reads "
                f"({FORMAT_VERSION}); upgrade itune_hf or export with this one"
            )
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        image, self.decoder_file = self._graphs(int8)
        self.image = self._session(ort, image, options)
        self.image_outputs = [output.name for output in self.image.get_outputs()]
        self.decoder = self._session(ort, self.decoder_file, options)
        self.vocabulary = _Vocabulary.of(self.config)

    def _graphs(self, int8: bool | None) -> tuple[str, str]:
        """The image and decoder files to run: the export's choice (`graphs`), or its fp32/int8 decoder."""
        from .export import DECODER_FILE, DECODER_INT8_FILE
        from .graphs import VISION_FILE

        graphs = self.config.get("graphs", {"image": VISION_FILE, "decoder": DECODER_FILE})  # version 1: I-Tuning's
        if int8 is None:
            return graphs["image"], graphs["decoder"]
        if int8 and self.config.get("quantize") != "int8":
            raise InputError(
                f"{self.directory}: no int8 decoder in this export; export with itune export --quantize int8"
            )
        return graphs["image"], DECODER_INT8_FILE if int8 else DECODER_FILE

    def _session(self, ort, name: str, options):
        path = self.directory / name
        if not path.is_file():
            raise InputError(f"{self.directory}: no {name}; export the model again (itune export)")
        try:
            return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as error:  # onnxruntime raises its own exception types for a damaged graph
            raise InputError(
                f"{path}: cannot read the ONNX graph ({type(error).__name__}: {error}); export again"
            ) from error

    def generate(
        self,
        pixel_values,
        decoder_input_ids=None,
        decoder_attention_mask=None,
        *,
        num_beams: int | None = None,
        max_new_tokens: int | None = None,
        max_length: int | None = None,
        **settings: Any,
    ) -> np.ndarray:
        """Caption a batch: the prompt (default: the start token) followed by the generated tokens, `(B, T)`,
        padded with the padding token, as the torch model's `generate` returns them (decode with the processor).

        Args:
            pixel_values: `(B, 3, H, W)` from the processor (a torch tensor or an array).
            decoder_input_ids: `(B, T0)` prompt tokens, the start token first (the processor's).
            decoder_attention_mask: `(B, T0)`, 0 on padding.
            num_beams: 1 = greedy (default: the exported model's generation config).
            max_new_tokens: Longest caption (default: the exported model's).
            max_length: Longest prompt and caption together, as transformers reads it, when `max_new_tokens` is
                not given.
            **settings: Other `generate` settings, at transformers' defaults (a `GenerationConfig`'s); one the
                runtime would not apply (`do_sample=True`, `no_repeat_ngram_size=2`, ...) is refused.

        Raises:
            InputError: a setting the runtime does not apply or does not know, or a caption longer than the exported
                LM's positions.
        """
        _check_settings(settings)
        pixels = _array(pixel_values, np.float32)
        batch = pixels.shape[0]
        start = self.config["decoder_start_token_id"]
        ids = _array(decoder_input_ids, np.int64) if decoder_input_ids is not None else np.full((batch, 1), start)
        mask = _array(decoder_attention_mask, np.int64) if decoder_attention_mask is not None else np.ones_like(ids)
        beams = num_beams or self.config["num_beams"]
        length = max_new_tokens or (max(max_length - ids.shape[1], 1) if max_length else None)
        length = length or self._default_length(ids.shape[1])
        positions = self.config.get("max_positions")
        if positions and ids.shape[1] + length > positions:
            raise InputError(
                f"max_new_tokens {length} (--max-new-tokens): the exported language model has {positions} positions "
                f"({ids.shape[1]} taken before the caption), so a caption has at most {positions - ids.shape[1]} tokens"
            )
        image = dict(zip(self.image_outputs, self.image.run(None, {"pixel_values": pixels})))
        ids = self.vocabulary.to_graph(ids)
        if beams == 1:
            return self.vocabulary.to_tokenizer(self._greedy(image, ids, mask, length))
        return self.vocabulary.to_tokenizer(self._beam_search(image, ids, mask, length, beams))

    def _default_length(self, prompt: int) -> int:
        """The exported model's longest caption after a prompt of `prompt` tokens: its `max_new_tokens`, or its
        `max_length` (XGPT's, prompt included) less the prompt."""
        if self.config.get("max_new_tokens"):
            return self.config["max_new_tokens"]
        return max(self.config["max_length"] - prompt, 1)

    def _empty_cache(self, rows: int) -> np.ndarray:
        config = self.config
        return np.zeros((config["num_layers"], rows, config["kv_heads"], 0, config["head_dim"]), np.float32)

    def _step(self, ids, mask, image: dict, keys, values) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One decoder step; `image`: the image graph's outputs by name (the same for every step)."""
        feed = {"input_ids": ids, "attention_mask": mask, **image, "past_keys": keys}
        return tuple(self.decoder.run(None, {**feed, "past_values": values}))

    def _greedy(self, image: dict, ids, mask, length: int) -> np.ndarray:
        eos, pad = self.vocabulary.eos, self.vocabulary.pad
        keys = values = self._empty_cache(ids.shape[0])
        finished = np.zeros(ids.shape[0], bool)
        step = ids
        for _ in range(length):
            logits, keys, values = self._step(step, mask, image, keys, values)
            chosen = np.where(finished, pad, logits.argmax(-1))
            ids = np.concatenate([ids, chosen[:, None]], axis=1)
            mask = np.concatenate([mask, np.ones((mask.shape[0], 1), mask.dtype)], axis=1)
            finished |= chosen == eos
            step = chosen[:, None]
            if finished.all():
                break
        return ids

    def _beam_search(self, image: dict, ids, mask, length: int, beams: int) -> np.ndarray:
        """Beam search over each image's `beams` sequences (see the module docstring); returns the best caption of
        each image, padded. An image's beams share its image outputs (repeated once; a reordering stays within
        the image)."""
        batch = ids.shape[0]
        image = {name: np.repeat(array, beams, axis=0) for name, array in image.items()}
        ids, mask = (np.repeat(x, beams, axis=0) for x in (ids, mask))
        search = _Beams(batch, beams, ids.shape[1], self.vocabulary.eos)
        keys = values = self._empty_cache(batch * beams)
        step = ids
        for new in range(1, length + 1):
            logits, keys, values = self._step(step, mask, image, keys, values)
            rows, chosen = search.advance(_log_softmax(logits), ids)
            ids = np.concatenate([ids[rows], chosen[:, None]], axis=1)
            mask = np.concatenate([mask[rows], np.ones((len(rows), 1), mask.dtype)], axis=1)
            keys, values, step = keys[:, rows], values[:, rows], chosen[:, None]
            if search.all_done(new):
                break
        return search.best(ids, self.vocabulary.pad)


#: `generate` outputs other than the token ids, which the runtime does not return.
_OUTPUT_OPTIONS = ("return_dict_in_generate", "output_scores", "output_logits")


def _check_settings(settings: dict[str, Any]) -> None:
    """Refuse `generate` settings the runtime would not apply: one of `UNAPPLIED_GENERATION_SETTINGS` or
    `_OUTPUT_OPTIONS` off its default, or one no `GenerationConfig` knows."""
    from transformers import GenerationConfig

    from .export import unapplied_generation_settings

    known = GenerationConfig().to_dict()
    unknown = sorted(name for name in settings if name not in known)
    unapplied = unapplied_generation_settings(settings)
    unapplied.update({name: settings[name] for name in _OUTPUT_OPTIONS if settings.get(name)})
    if unknown or unapplied:
        given = ", ".join([f"{name}={value!r}" for name, value in unapplied.items()] + unknown)
        raise InputError(
            f"generate({given}): the ONNX runtime does not apply it (it decodes greedily or by beam search, length "
            "penalty 1, takes num_beams and max_new_tokens or max_length, and returns the token ids): drop it, or "
            "caption with the torch model"
        )


class _Vocabulary:
    """The ids the decoder graph speaks: the tokenizer's, or a shortlist's (`vocabulary` in the config: shortlist id
    `i` is tokenizer id `vocabulary[i]`), with the end and padding tokens in them."""

    def __init__(self, full_ids: list[int] | None, eos: int, pad: int | None) -> None:
        self.full_ids = None if full_ids is None else np.asarray(full_ids, np.int64)
        self.short_ids = None
        if self.full_ids is not None:
            self.short_ids = np.full(int(self.full_ids.max()) + 1, -1, np.int64)
            self.short_ids[self.full_ids] = np.arange(len(self.full_ids))
        self.eos = int(self.to_graph(np.array([eos]), "the export's eos_token_id")[0])
        self.pad = self.eos if pad is None else int(self.to_graph(np.array([pad]), "the export's pad_token_id")[0])

    @classmethod
    def of(cls, config: dict[str, Any]) -> _Vocabulary:
        """The vocabulary an export's config describes."""
        eos = config["eos_token_id"]
        return cls(config.get("vocabulary"), eos[0] if isinstance(eos, list) else eos, config.get("pad_token_id"))

    def to_graph(self, ids: np.ndarray, what: str = "the prompt (decoder_input_ids)") -> np.ndarray:
        """Tokenizer ids -> the graph's; an `InputError` naming `what` for a token outside the shortlist."""
        if self.short_ids is None:
            return ids
        inside = (ids >= 0) & (ids < len(self.short_ids))
        short = np.where(inside, self.short_ids[np.where(inside, ids, 0)], -1)
        if (short < 0).any():
            missing = sorted(set(ids[short < 0].tolist()))[:10]
            raise InputError(
                f"{what}: token ids {missing} are not in the export's vocabulary shortlist ({len(self.full_ids)} "
                "tokens); export with a shortlist built from captions that contain them, or without --vocabulary"
            )
        return short

    def to_tokenizer(self, ids: np.ndarray) -> np.ndarray:
        """The graph's ids -> the tokenizer's."""
        return ids if self.full_ids is None else self.full_ids[ids]


class _Beams:
    """The bookkeeping of beam search as transformers does it (length penalty 1, `early_stopping=False`): running
    scores are summed log-probabilities; a candidate ending in the end token among an image's best `beams` joins
    its finished captions, scored by its sum over its generated length; an image is done once it has `beams`
    finished captions and its best running beam, at the current length, cannot beat the worst of them."""

    def __init__(self, batch: int, beams: int, prompt: int, eos: int) -> None:
        self.batch, self.beams, self.prompt, self.eos = batch, beams, prompt, eos
        self.scores = np.tile(np.r_[0.0, np.full(beams - 1, -1e9)], batch)  # only the first beam is live at first
        self.finished: list[list[tuple[float, np.ndarray]]] = [[] for _ in range(batch)]
        self.done = np.zeros(batch, bool)

    def advance(self, log_probs: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The rows of `ids` the next running beams continue and their tokens; finished captions are recorded."""
        vocab = log_probs.shape[1]
        flat = (log_probs + self.scores[:, None].astype(np.float32)).reshape(self.batch, self.beams * vocab)
        top = _top_k(flat, 2 * self.beams)
        generated = ids.shape[1] + 1 - self.prompt
        rows, tokens, scores = [], [], []
        for image in range(self.batch):
            running = []
            for rank, candidate in enumerate(top[image]):
                beam, token = divmod(int(candidate), vocab)
                row, score = image * self.beams + beam, float(flat[image, candidate])
                if token != self.eos:
                    running.append((row, token, score))
                elif rank < self.beams and not self.done[image]:
                    self._finish(image, score / generated, np.append(ids[row], token))
            for row, token, score in running[: self.beams]:
                rows.append(row), tokens.append(token), scores.append(score)
        self.scores = np.array(scores)
        return np.array(rows), np.array(tokens, np.int64)

    def _finish(self, image: int, score: float, caption: np.ndarray) -> None:
        hypotheses = self.finished[image]
        hypotheses.append((score, caption))
        hypotheses.sort(key=lambda item: -item[0])
        del hypotheses[self.beams :]

    def all_done(self, generated: int) -> bool:
        """Mark the images that are done at this generated length; whether all are."""
        best = self.scores.reshape(self.batch, self.beams).max(axis=1) / generated
        for image, hypotheses in enumerate(self.finished):
            if len(hypotheses) >= self.beams and best[image] <= hypotheses[-1][0]:
                self.done[image] = True
        return bool(self.done.all())

    def best(self, ids: np.ndarray, pad: int) -> np.ndarray:
        """Each image's best caption (its finished ones, and its running beams scored at their length), padded."""
        generated = ids.shape[1] - self.prompt
        chosen = []
        for image in range(self.batch):
            rows = range(image * self.beams, (image + 1) * self.beams)
            running = [] if self.done[image] else [(self.scores[row] / generated, ids[row]) for row in rows]
            chosen.append(max([*self.finished[image], *running], key=lambda item: item[0])[1])
        width = max(len(caption) for caption in chosen)
        return np.stack([np.pad(c, (0, width - len(c)), constant_values=pad) for c in chosen])


def _top_k(values: np.ndarray, k: int) -> np.ndarray:
    """The indices of each row's `k` largest values, largest first (ties: the lower index first), found by a
    partition rather than a sort of the whole row (beams x vocabulary values)."""
    part = np.argpartition(-values, k - 1, axis=1)[:, :k]
    chosen = np.take_along_axis(values, part, axis=1)
    order = np.lexsort((part, -chosen), axis=1)
    return np.take_along_axis(part, order, axis=1)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _array(value, dtype) -> np.ndarray:
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.ascontiguousarray(value, dtype=dtype)


def load_onnx_captioner(
    directory: str | os.PathLike, *, threads: int | None = None, int8: bool | None = None
) -> tuple[OnnxCaptioner, Any]:
    """The exported captioner and its processor (saved beside the graphs).

    Args:
        directory: What `itune export --format onnx` wrote.
        threads: Intra-op threads (default: onnxruntime's).
        int8: Which decoder to run (see `OnnxCaptioner`; default: the export's).
    """
    from transformers import AutoProcessor

    from ..utils.files import reading

    captioner = OnnxCaptioner(directory, threads=threads, int8=int8)
    with reading(directory, "the processor", "export the model again (itune export)"):
        processor = AutoProcessor.from_pretrained(str(directory))
    return captioner, processor


__all__ = ["OnnxCaptioner", "load_onnx_captioner", "require_onnxruntime"]

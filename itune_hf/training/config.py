"""`TrainingConfig`: the settings of `itune train`, apart from `itune_hf.training` so that reading them (the flags
of `itune train --help`) imports no torch. `from itune_hf.training import TrainingConfig` works too."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..models import families, get_family
from ..models.ituning.settings import ITuningSettings
from ..models.quantization import LOAD_IN, check_load_in
from ..models.registry import DEFAULT_FAMILY
from ..models.xgpt.settings import VISUAL_SOURCES, XGPTSettings
from ..utils.numbers import NON_NEGATIVE_FLOAT, NON_NEGATIVE_INT, POSITIVE_FLOAT, POSITIVE_INT, Number
from ..utils.runtime import MIXED_PRECISION, available_cpus

#: The validation split when none is named: a dataset without it trains without validation (warned); a split
#: named on purpose that the data lacks is refused
DEFAULT_EVAL_SPLIT = "val"

SCHEDULES = ("cosine", "linear", "constant", "inverse_sqrt")
#: How several pre-training tasks share an iteration: one update per task in turn (the paper), or one summed update.
TASK_SCHEDULES = ("alternate", "sum")
IDA_MASKING = ("single", "multi")
#: The pre-training options that act only when their task is in `tasks`.
TASK_OPTIONS = {"imlm_fraction": "imlm", "ida_mask_ratio": "ida", "ida_span_mean": "ida", "ida_masking": "ida"}
ON_MISSING = ("report", "error")
#: What a run optimises: cross-entropy on the references, or self-critical sequence training (`training/scst.py`).
OBJECTIVES = ("ce", "scst")
#: The baseline a sampled caption's SCST reward is compared with: the greedy caption's, or the other samples' mean.
SCST_BASELINES = ("greedy", "mean")
# the kind of every numeric option (flags and recipe keys alike; the settings of a model family are checked by it)
NUMBERS: dict[str, Number] = {
    "num_epochs": POSITIVE_FLOAT,
    "max_steps": POSITIVE_INT,
    "batch_size": POSITIVE_INT,
    "gradient_accumulation_steps": POSITIVE_INT,
    "learning_rate": NON_NEGATIVE_FLOAT,  # 0: a run that only loads and saves (e.g. checking --init-adapter)
    "weight_decay": NON_NEGATIVE_FLOAT,
    "warmup_steps": NON_NEGATIVE_INT,
    "max_grad_norm": NON_NEGATIVE_FLOAT,
    "time_budget": POSITIVE_FLOAT,
    "max_caption_length": Number(int, 3),  # BOS, one token, EOS
    "retrieval_k": Number(int, 1, 32),
    "seed": Number(int, 0, 2**32 - 1),  # numpy's seed range
    "save_every": POSITIVE_INT,
    "keep_checkpoints": POSITIVE_INT,
    "eval_every": POSITIVE_INT,
    "eval_max_images": POSITIVE_INT,
    "eval_batch_size": POSITIVE_INT,
    "eval_max_new_tokens": POSITIVE_INT,
    "log_every": POSITIVE_INT,
    "num_workers": Number(int, 0, available_cpus()),  # more workers than cores only wait for a core
    "max_train_images": POSITIVE_INT,
    "shuffle_buffer": POSITIVE_INT,
    "max_unreadable": Number(float, 0, 1),  # a fraction of the data
    "scst_samples": Number(int, 1, 64),
    "scst_ending_penalty": NON_NEGATIVE_FLOAT,
}
#: The optimisation settings that suit a model rather than a run: where neither the command line nor a recipe sets
#: one, the preset's `"training"` entry (presets/models.json) gives it, else its model family's `training_defaults`,
#: else this table. `TrainingConfig.defaults_from` says which, and `itune train` prints it.
TRAINING_DEFAULTS: dict[str, object] = {
    "batch_size": 32,
    "learning_rate": 1e-4,
    "warmup_steps": 0,
    "lr_schedule": "cosine",
    "weight_decay": 0.01,
    "adam_beta2": 0.999,
}
# what an optional option (`int | None`, ...) reads as None when given as text
NONE_WORDS = ("none", "null", "")
#: Options whose "none" is a value, not "not given": `--exclude-coco-split none` keeps the COCO images knowingly
NONE_IS_A_VALUE = ("exclude_coco_split",)


def _settings_class(family: str) -> type:
    """The dataclass of a model family's settings (its registry entry's `settings_class`); each setting is a
    `TrainingConfig` field of the same name."""
    return get_family(family).load("settings_class")


def _family_setting(family: str):
    """The field of an `itune train` option overriding one setting of a model family (same name as in the family's
    settings class, whose help it shows); `None` keeps the preset's value."""
    return field(default=None, metadata={"family": family})


def _option_type(name: str) -> tuple[type, bool]:
    """The base type of field `name` (`int` for `int | None`) and whether it is optional."""
    annotation = str(_FIELD_TYPES[name])  # postponed annotations: "int | None"
    parts = [part.strip() for part in annotation.split("|")]
    base = {"int": int, "float": float, "bool": bool, "str": str}[parts[0]]
    return base, "None" in parts


def _describe(name: str, kind: type) -> str:
    if kind in (int, float):
        return NUMBERS.get(name, Number(kind)).describe()
    return {bool: "true or false", str: "a string"}[kind]


def _boolean(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
        return value.strip().lower() in ("true", "yes", "on", "1")
    raise ValueError(value)


@dataclass
class TrainingConfig:
    """Everything `itune train` needs. Every field is a command-line option (`--learning-rate` for
    `learning_rate`) and a key of a `--config` recipe file (YAML or JSON)."""

    output_dir: str = field(metadata={"help": "Where the adapter, checkpoints and logs go."})
    data: str = field(
        default="synthetic",
        metadata={"help": "Training data (see itune_hf.data.load_captions); shards/{00000..00009}.tar streams them."},
    )
    image_root: str | None = field(default=None, metadata={"help": "Directory image paths are relative to."})
    allow_outside_image_root: bool = field(
        default=False,
        metadata={
            "help": "Read images the data file places outside the image root (.., absolute paths, symlinks out of "
            "it); by default such a file is refused, naming the entry."
        },
    )
    train_split: str = field(default="train", metadata={"help": "Split to train on."})
    eval_split: str | None = field(
        default=DEFAULT_EVAL_SPLIT, metadata={"help": "Split for validation (none: no validation)."}
    )
    on_missing: str = field(default="report", metadata={"help": "Missing images: report (skip) or error (stop)."})
    verify_images: bool = field(
        default=False,
        metadata={"help": "Decode every image before training; undecodable ones are skipped or stop per on_missing."},
    )
    max_unreadable: float = field(
        default=0.05,
        metadata={
            "help": "Largest fraction of images that may be missing or unreadable: above it training refuses to start "
            "(or stops once that many prove unreadable); below it they are reported and skipped."
        },
    )
    preset: str | None = field(default="itune-demo", metadata={"help": "Model preset (see itune params)."})
    vision_model: str | None = field(
        default=None,
        metadata={
            "help": "Vision tower id/dir: instead of a preset, or with an I-Tuning preset other weights for its tower "
            "(same architecture, e.g. from itune pretrain-vision)."
        },
    )
    text_model: str | None = field(
        default=None,
        metadata={
            "help": "Causal LM id/dir: with --vision-model and --preset none, the backbones instead of a preset."
        },
    )
    pretrained: bool = field(default=True, metadata={"help": "Load the preset's real backbone weights."})
    family: str | None = field(
        default=None, metadata={"help": "Model family without a preset (itune_hf.models; default: ituning)."}
    )
    # I-Tuning settings: one option each, named and checked as in ITuningSettings (None: the preset's value)
    bottleneck_dim: int | None = _family_setting("ituning")
    num_heads: int | None = _family_setting("ituning")
    scale: float | None = _family_setting("ituning")
    attention_scale: float | None = _family_setting("ituning")
    first_layer: int | None = _family_setting("ituning")
    init: str | None = _family_setting("ituning")
    dropout: float | None = _family_setting("ituning")
    visual_tokens: str | None = _family_setting("ituning")
    final_norm: bool | None = _family_setting("ituning")
    # XGPT settings, as in XGPTSettings (None: the preset's value)
    architecture: str | None = _family_setting("xgpt")
    use_aoa_refiner: bool | None = _family_setting("xgpt")
    encoder_signal: str | None = _family_setting("xgpt")
    region_feature_norm: bool | None = _family_setting("xgpt")
    # XGPT's visual input (fields of XGPTConfig, not ablation switches; None: the preset's)
    visual_source: str | None = field(
        default=None,
        metadata={
            "family": "xgpt",
            "help": f"Where the regions come from: {', '.join(VISUAL_SOURCES)} (grid: the vision tower's patch grid; "
            "boxes: its patches pooled in each image's object boxes, the data's boxes column, the whole image where "
            "an image has none; regions: precomputed --region-features). Unset: the preset's.",
        },
    )
    region_features: str | None = field(
        default=None,
        metadata={
            "family": "xgpt",
            "help": "Precomputed region features (a directory of <image_id>.npz or a bottom-up-attention .tsv; see "
            "itune_hf.data.regions): the model reads them instead of images (implies --visual-source regions).",
        },
    )
    init_model: str | None = field(
        default=None,
        metadata={
            "help": "Start from this trained run's model: for XGPT a model directory (itune train's output, or the "
            "average of the top-4 pre-training checkpoints from itune average-checkpoints: stage 2 and fine-tuning); "
            "for I-Tuning an itune train output directory (its adapter, as --init-adapter). Required by "
            "--objective scst."
        },
    )
    # The objective (training/scst.py: self-critical sequence training after cross-entropy)
    objective: str = field(
        default="ce",
        metadata={
            "help": "ce: cross-entropy on the reference captions; scst: self-critical sequence training (Rennie et "
            "al. 2017) of a trained run (--init-model): the expected --scst-reward of sampled captions, against a "
            "baseline (--scst-baseline)."
        },
    )
    scst_reward: str = field(
        default="CIDEr",
        metadata={
            "help": "SCST: the registered metric whose per-image score is the reward (CIDEr: CIDEr-D with the "
            "training split's document frequencies; Objects: object F1 against a generated world's scenes; BLEU "
            "(BLEU-4), ROUGE_L)."
        },
    )
    scst_samples: int = field(default=1, metadata={"help": "SCST: captions sampled per training caption."})
    scst_baseline: str = field(
        default="greedy",
        metadata={
            "help": "SCST: greedy (the greedy caption's reward, the paper's) or mean (the mean reward of the "
            "other samples of the image: 'new SCST', needs --scst-samples 2 or more; no greedy decoding)."
        },
    )
    scst_count_eos: bool = field(
        default=True,
        metadata={
            "help": "SCST: the n-gram rewards (CIDEr, BLEU, ROUGE_L) read the end of a finished caption as a word, "
            'so that an ending no reference has ("... with a") scores lower; a caption cut at the length limit '
            "has none."
        },
    )
    scst_ending_penalty: float = field(
        default=0.0,
        metadata={
            "help": "SCST: subtracted from the reward of a caption that ends in a function word (a, the, with, of, "
            "...), the known pitfall of SCST; 0: none (the rate is logged as train/bad_endings either way)."
        },
    )
    # Pre-training tasks (itune_hf.training.pretraining; XGPT section 4.3)
    tasks: str = field(
        default="ic",
        metadata={
            "help": "Comma-separated training tasks: ic (captioning), imlm (masked fragment), ida (denoising with "
            "one [MASK] per span), tifg (image features from text; XGPT only)."
        },
    )
    task_weights: str | None = field(
        default=None,
        metadata={
            "help": "Comma-separated positive weights, one per task (default: all 1): lambda of the paper's weighted "
            "sum of losses; under the alternate schedule each scales its task's update (learning rate)."
        },
    )
    task_schedule: str = field(
        default="alternate",
        metadata={
            "help": "alternate: one optimizer update per task in turn every iteration (the paper; needs "
            "gradient_accumulation_steps 1); sum: one update on the weighted sum."
        },
    )
    imlm_fraction: float = field(default=0.5, metadata={"help": "IMLM: share of the caption in its one fragment."})
    ida_mask_ratio: float = field(default=0.3, metadata={"help": "IDA: share of the caption's tokens masked."})
    ida_span_mean: float = field(default=3.0, metadata={"help": "IDA: mean Poisson span length."})
    ida_masking: str = field(
        default="single", metadata={"help": "IDA: single [MASK] per span (the paper) or multi (one per token)."}
    )
    init_adapter: str | None = field(
        default=None, metadata={"help": "Start from this adapter's weights (e.g. fine-tune after VLP)."}
    )
    feature_cache: str | None = field(default=None, metadata={"help": "Feature cache dir (itune cache-features)."})
    retrieval: str | None = field(
        default=None,
        metadata={
            "help": "Retrieval augmentation (I-Tuning): the captions of the --retrieval-k training images most like "
            "each image (pooled tower features from --feature-cache; never the image's own near-duplicate group) "
            "become the prompt its caption continues. 'train' builds the datastore from the training split; or a "
            "datastore folder. Saved with the model (datastore/)."
        },
    )
    retrieval_k: int = field(default=4, metadata={"help": "Retrieved captions per prompt (SmallCap: 4)."})
    num_epochs: float = field(default=30.0, metadata={"help": "Epochs over (image, caption) pairs (paper: 30)."})
    max_steps: int | None = field(default=None, metadata={"help": "Stop after this many optimizer steps."})
    batch_size: int | None = field(default=None, metadata={"help": "Captions per device per micro-batch."})
    group_by_length: bool = field(
        default=False,
        metadata={
            "help": "Batch captions of similar token length together, as transformers' group_by_length: each epoch's "
            "random order is cut into mega-batches of 50 batches, each sorted by length, and the batches shuffled. "
            "Less padding (the demo's world: 1.7x fewer tokens); map-style data only."
        },
    )
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "Micro-batches per optimizer step."})
    learning_rate: float | None = field(default=None, metadata={"help": "Peak learning rate of AdamW."})
    weight_decay: float | None = field(
        default=None,
        metadata={
            "help": "AdamW weight decay of the weights (norm layers, biases and token-like vectors are not decayed); "
            "0 is Adam, XGPT's optimizer."
        },
    )
    adam_beta1: float = field(default=0.9, metadata={"help": "AdamW beta1."})
    adam_beta2: float | None = field(default=None, metadata={"help": "AdamW beta2 (XGPT's paper: 0.98)."})
    warmup_steps: int | None = field(default=None, metadata={"help": "Linear warm-up steps."})
    lr_schedule: str | None = field(default=None, metadata={"help": f"Decay after warm-up: {', '.join(SCHEDULES)}."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm (0: none)."})
    mixed_precision: str = field(
        default="auto",
        metadata={
            "help": "auto (bf16 where the device runs it natively, else fp32; under accelerate launch, the "
            "launcher's mixed precision, as given to accelerate launch or in its config), no, bf16, fp16 (these "
            "win over the launcher's)."
        },
    )
    time_budget: float | None = field(
        default=None,
        metadata={
            "help": "Seconds for the optimizer steps (validation, checkpoints excluded): the step count is sized "
            "from a short measurement to fit, at most max_steps/num_epochs, and fitted again (the schedule with it) "
            "once steps 3-10 are timed; a run that overruns by 20% stops early."
        },
    )
    gradient_checkpointing: bool = field(default=False, metadata={"help": "Recompute LM activations in backward."})
    torch_compile: bool = field(
        default=False,
        metadata={
            "help": "Run the model's forward and backward through torch.compile (inductor, shapes dynamic: one "
            "graph for every caption length; caption batches then run padded, not packed), as Accelerate's dynamo "
            "backend inductor does. The first steps compile (minutes at the papers' sizes); on a GPU the "
            "benchmark's compiled step (fixed shapes) was 2.05x faster at GPT-2 large, batch 512 "
            "(benchmarks/RESULTS.md); with dynamic shapes it is not measured on a GPU yet."
        },
    )
    load_in: str | None = field(
        default=None,
        metadata={
            "help": f"Load the frozen LM quantised: {', '.join(LOAD_IN)} (bitsandbytes: LLM.int8() or NF4; CPU or "
            "CUDA), about 4x or 7.5x fewer bytes; its LM head, the vision tower and the trained modules stay in full "
            "precision. itune caption/eval load the run the same way. I-Tuning only. Default: full precision.",
        },
    )
    max_caption_length: int = field(default=40, metadata={"help": "Token budget per caption (BOS/EOS included)."})
    seed: int = field(default=0, metadata={"help": "Seed of data order, dropout and initialisation."})
    save_every: int = field(default=500, metadata={"help": "Checkpoint every N optimizer steps."})
    keep_checkpoints: int = field(
        default=2,
        metadata={
            "help": "Checkpoints kept: the newest and the best others by validation CIDEr (without validation, the "
            "newest ones); as many as itune average-checkpoints --top averages."
        },
    )
    eval_every: int | None = field(default=None, metadata={"help": "Validate every N steps (default: per epoch)."})
    eval_max_images: int | None = field(default=500, metadata={"help": "Validation images (none: all)."})
    eval_batch_size: int = field(default=32, metadata={"help": "Images per generate() call in validation."})
    eval_max_new_tokens: int = field(default=30, metadata={"help": "Longest validation caption."})
    log_every: int = field(default=10, metadata={"help": "Log loss and learning rate every N steps."})
    report_to: str = field(default="tensorboard", metadata={"help": "Trackers: tensorboard or none."})
    num_workers: int = field(default=0, metadata={"help": "DataLoader worker processes."})
    max_train_images: int | None = field(default=None, metadata={"help": "Use only the first N training images."})
    shuffle_buffer: int = field(
        default=1000, metadata={"help": "Pairs in the shuffle buffer of streamed data (shards); 1: shard order only."}
    )
    exclude_coco_split: str | None = field(
        default=None,
        metadata={
            "help": "Visual Genome data: the Karpathy dataset_coco.json whose val/test images are dropped "
            "(default: one beside the VG file, else a warning); none keeps them."
        },
    )
    image_column: str | None = field(
        default=None,
        metadata={"help": "Hugging Face datasets: the column holding the images (default: the first known name)."},
    )
    caption_column: str | None = field(
        default=None,
        metadata={
            "help": "Hugging Face datasets: the column holding the captions (default: the first known name); a "
            "Karpathy dataset.json: the entry field read as the captions in place of sentences (e.g. alt_text)."
        },
    )
    resume: bool = field(default=False, metadata={"help": "Continue from the latest checkpoint in output_dir."})
    overwrite: bool = field(default=False, metadata={"help": "Start over in an output_dir holding a run."})

    def __post_init__(self) -> None:
        for option in dataclasses.fields(self):  # every value typed once: a recipe's "1e-4" is a number
            setattr(self, option.name, self.coerce(option.name, getattr(self, option.name)))
        self.defaults_from: dict[str, str] = {}  # training default -> where its value came from (not a field)
        for name, (value, source) in training_defaults(self.preset, self.family).items():
            if getattr(self, name) is None:
                setattr(self, name, self.coerce(name, value))
                self.defaults_from[name] = source
        if self.eval_split is not None and self.eval_split.lower() in NONE_WORDS:
            self.eval_split = None
        if self.on_missing not in ON_MISSING:
            raise ValueError(f"on_missing must be one of {ON_MISSING}, got {self.on_missing!r}")
        if self.mixed_precision not in MIXED_PRECISION:
            raise ValueError(f"mixed_precision must be one of {MIXED_PRECISION}, got {self.mixed_precision!r}")
        self.load_in = check_load_in(self.load_in)
        if self.lr_schedule not in SCHEDULES:
            raise ValueError(f"lr_schedule must be one of {SCHEDULES}, got {self.lr_schedule!r}")
        self._check_backbones()
        for family in families():
            if get_family(family).settings_class is not None:
                _settings_class(family)(**self.setting_overrides(family))  # checked as the family checks them
        self._check_visual_input()
        self._check_tasks()
        self._check_objective()

    @staticmethod
    def coerce(name: str, value: object) -> object:
        """`value` of option `name` as the option's type (`int`, `float`, `bool`, `str`, or None where optional),
        checked against its bounds (`NUMBERS`): a recipe's `learning_rate: 1e-4` (a string to YAML) becomes 1e-4.

        Args:
            name: A `TrainingConfig` field.
            value: The value given (from a flag, a recipe or Python).

        Raises:
            ValueError: "<name>: expected <type>, got <value>".
        """
        kind, optional = _option_type(name)
        said_none = isinstance(value, str) and value.strip().lower() in NONE_WORDS and name not in NONE_IS_A_VALUE
        if value is None or (optional and said_none):
            if optional:
                return None
            raise ValueError(f"{name}: expected {_describe(name, kind)}, got None")
        try:
            if kind in (int, float):
                return NUMBERS.get(name, Number(kind)).parse(value)
            if kind is bool:
                return _boolean(value)
            if isinstance(value, str):
                return value
        except ValueError:
            pass
        raise ValueError(f"{name}: expected {_describe(name, kind)}, got {value!r}")

    def _check_backbones(self) -> None:
        """A preset, or the two backbones to build from (a preset's own LM is not replaced)."""
        if self.preset is None and not (self.vision_model and self.text_model):
            raise ValueError("Pass a preset, or both vision_model and text_model")
        if self.preset and self.text_model:
            raise ValueError(
                f"--text-model {self.text_model} with --preset {self.preset}: a preset builds its own language model; "
                "to build from backbones pass --preset none with --vision-model and --text-model, or drop --text-model"
            )
        if not self.preset and not self.pretrained:
            raise ValueError(
                f"--no-pretrained builds a preset's backbones at random; --vision-model {self.vision_model} and "
                f"--text-model {self.text_model} load their weights: drop --no-pretrained, or name a preset"
            )

    def _check_tasks(self) -> None:
        """Check the pre-training options (task names and weights are checked by `itune_hf.training.pretraining`)."""
        if self.task_schedule not in TASK_SCHEDULES:
            raise ValueError(f"task_schedule must be one of {TASK_SCHEDULES}, got {self.task_schedule!r}")
        if self.ida_masking not in IDA_MASKING:
            raise ValueError(f"ida_masking must be one of {IDA_MASKING}, got {self.ida_masking!r}")
        for name in ("imlm_fraction", "ida_mask_ratio"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {getattr(self, name)}")
        if self.ida_span_mean <= 0:
            raise ValueError(f"ida_span_mean must be positive, got {self.ida_span_mean}")
        if not (0 <= self.adam_beta1 < 1 and 0 <= self.adam_beta2 < 1):
            raise ValueError(f"adam_beta1, adam_beta2 must be in [0, 1), got {self.adam_beta1}, {self.adam_beta2}")
        named = {name.strip().lower() for name in self.tasks.split(",")}
        defaults = {option.name: option.default for option in dataclasses.fields(self)}
        unused = [
            name for name, task in TASK_OPTIONS.items() if task not in named and getattr(self, name) != defaults[name]
        ]
        if unused:
            flags = ", ".join("--" + name.replace("_", "-") for name in unused)
            tasks = sorted({TASK_OPTIONS[name].upper() for name in unused})
            raise ValueError(
                f"{flags}: options of the {' and '.join(tasks)} pre-training task{'s' if len(tasks) > 1 else ''}, "
                f"which --tasks {self.tasks} does not include; add {'them' if len(tasks) > 1 else 'it'} to --tasks "
                "or drop the options"
            )
        if self.pretraining:
            from .pretraining import parse_tasks

            tasks = parse_tasks(self.tasks, self.task_weights)
            if len(tasks) > 1 and self.task_schedule == "alternate" and self.gradient_accumulation_steps > 1:
                raise ValueError(
                    "task_schedule='alternate' updates once per task per micro-batch, which gradient accumulation "
                    "cannot split: use gradient_accumulation_steps 1, or task_schedule='sum'"
                )

    def _check_objective(self) -> None:
        """Check `objective` and the SCST options (the reward's data is checked when the run opens it)."""
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        if self.scst_baseline not in SCST_BASELINES:
            raise ValueError(f"scst_baseline must be one of {SCST_BASELINES}, got {self.scst_baseline!r}")
        if self.objective != "scst":
            given = [f.name for f in dataclasses.fields(self) if f.name.startswith("scst_") and
                     getattr(self, f.name) != f.default]  # fmt: skip
            if given:
                flags = ", ".join("--" + name.replace("_", "-") for name in given)
                raise ValueError(f"{flags}: options of --objective scst, but the objective is {self.objective}")
            return
        if not self.init_model:
            raise ValueError(
                "--objective scst fine-tunes a trained captioner: pass --init-model RUN (the output directory of an "
                "itune train run with the same --preset)"
            )
        if self.scst_baseline == "mean" and self.scst_samples < 2:
            raise ValueError(
                f"--scst-baseline mean compares each sample with the other samples of its image: pass --scst-samples "
                f"2 or more (got {self.scst_samples}), or --scst-baseline greedy"
            )
        if self.pretraining:
            raise ValueError(f"--objective scst trains captioning only; drop --tasks {self.tasks} / --task-weights")
        if self.retrieval:
            raise ValueError(
                f"--retrieval {self.retrieval} with --objective scst: SCST samples its captions without the retrieved "
                "captions' prompt, so the prompts would be read in validation only; drop one of them"
            )
        reward_metric(self.scst_reward)

    @property
    def pretraining(self) -> bool:
        """Whether the run trains other tasks than plain captioning (or weighs captioning)."""
        return self.tasks.strip().lower() != "ic" or self.task_weights is not None

    @property
    def masking(self):
        """The masking settings of the text tasks (`itune_hf.training.pretraining.Masking`)."""
        from .pretraining import Masking

        return Masking(self.imlm_fraction, self.ida_mask_ratio, self.ida_span_mean, self.ida_masking)

    def _check_visual_input(self) -> None:
        """Check `visual_source`, `region_features` and `feature_cache` together."""
        if self.visual_source is not None and self.visual_source not in VISUAL_SOURCES:
            raise ValueError(f"visual_source must be one of {VISUAL_SOURCES}, got {self.visual_source!r}")
        if self.region_features:
            if self.visual_source not in (None, "regions"):
                raise ValueError(
                    f"region_features={self.region_features!r} are precomputed regions (visual_source='regions'), but "
                    f"visual_source={self.visual_source!r}: drop one of them"
                )
            if self.feature_cache:
                raise ValueError(
                    f"feature_cache={self.feature_cache!r} holds vision-tower states, region_features="
                    f"{self.region_features!r} replace the vision tower: pass only one of them"
                )
        elif self.visual_source == "regions":
            raise ValueError("visual_source='regions' reads precomputed region features: pass region_features (a path)")

    @property
    def chosen_visual_source(self) -> str | None:
        """The XGPT visual source the run asks for: `visual_source`, else `"regions"` with `region_features`, else
        None (the preset's)."""
        return self.visual_source or ("regions" if self.region_features else None)

    # settings that fix what the run computes; a resumed run must use the same ones
    RESUME_INVARIANTS = ("data", "train_split", "preset", "family", "init_adapter", "vision_model", "text_model",
                         *ITuningSettings.names(), *XGPTSettings.names(), "visual_source", "region_features",
                         "init_model", "load_in", "objective", "scst_reward", "scst_samples", "scst_baseline",
                         "scst_count_eos", "scst_ending_penalty", "tasks", "task_weights", "task_schedule",
                         "imlm_fraction", "ida_mask_ratio",
                         "ida_span_mean", "ida_masking", "adam_beta1", "adam_beta2",
                         "batch_size", "gradient_accumulation_steps",
                         "learning_rate", "weight_decay", "warmup_steps", "lr_schedule", "seed", "num_epochs",
                         "max_steps", "max_caption_length", "max_train_images",
                         "shuffle_buffer", "exclude_coco_split", "image_column", "caption_column", "retrieval",
                         "retrieval_k")  # fmt: skip

    @staticmethod
    def help(name: str) -> str:
        """The help text of option `name` (an I-Tuning setting's comes from `ITuningSettings`)."""
        found = next(f for f in dataclasses.fields(TrainingConfig) if f.name == name)
        family = found.metadata.get("family")
        if family is not None:
            title = get_family(family).title
            if "help" in found.metadata:  # an option of the family that is not one of its settings
                return f"{title}: {found.metadata['help']}"
            return f"{title}: {_settings_class(family).help(name)} Unset: the preset's value."
        if name in TRAINING_DEFAULTS:
            return f"{found.metadata['help']} Default: the preset's, else its family's, else {TRAINING_DEFAULTS[name]}."
        return found.metadata.get("help", "")

    def setting_overrides(self, family: str) -> dict[str, object]:
        """The settings of model family `family` (the fields of its settings class) this run sets explicitly
        (`None`: the preset's value).

        Args:
            family: A registered family name.
        """
        names = _settings_class(family).names()
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}

    def foreign_settings(self, family: str) -> list[str]:
        """Options set for another model family than `family` (a run cannot honour them): its settings and its other
        options (XGPT's `visual_source`, `region_features`).

        Args:
            family: The family the run trains.
        """
        fields = dataclasses.fields(self)
        return [
            f.name
            for f in fields
            if f.metadata.get("family") not in (None, family) and getattr(self, f.name) is not None
        ]


def reward_metric(name: str):
    """The registered metric `name` as an SCST reward, and the result key whose per-image score is the reward (its
    model card's, e.g. `Bleu_4`, `Object_F1`).

    Args:
        name: A metric name (`--scst-reward`), any spelling `itune_hf.metrics.get_metric` takes.

    Raises:
        ValueError: an unknown metric, or one that runs Java (seconds per call, every step).
    """
    from ..metrics.registry import get_metric

    try:
        metric = get_metric(name)
    except ValueError as error:
        raise ValueError(f"--scst-reward {name}: {error}") from None
    if metric.needs_java:
        raise ValueError(
            f"--scst-reward {name}: {metric.name} runs a Java tool (seconds per call), and SCST scores every sampled "
            "caption at every step; choose CIDEr, BLEU, ROUGE_L or Objects"
        )
    return metric, metric.card_key or metric.keys[0]


def training_defaults(preset: str | None, family: str | None = None) -> dict[str, tuple[object, str]]:
    """The value of every `TRAINING_DEFAULTS` setting for a run of `preset` (or, without one, of model family
    `family`), with where it comes from: the preset's `"training"` entry, else its family's `training_defaults`, else
    the table.

    Args:
        preset: A preset name, or None (an unknown name leaves the choice to the family: the run reports it).
        family: The family of a run without a preset (default: the default family).

    Raises:
        ValueError: a preset or family names a setting that is not a training default.
    """
    from ..presets import get_preset

    chosen = {name: (value, "built-in") for name, value in TRAINING_DEFAULTS.items()}
    layers: list[tuple[dict[str, object], str]] = []
    if preset is not None:
        try:
            found = get_preset(preset)
        except KeyError:
            found = None
        if found is not None:
            family = found.family_name
            layers.append((found.training, f"preset {preset}"))
    try:
        layers.insert(0, (dict(get_family(family or DEFAULT_FAMILY).training_defaults), f"family {family}"))
    except KeyError:
        pass  # an unknown family is refused by name where the run builds its model
    for values, source in layers:
        for name, value in values.items():
            if name not in TRAINING_DEFAULTS:
                raise ValueError(
                    f"{source}: training default {name!r} is not one a preset or family may set "
                    f"({', '.join(TRAINING_DEFAULTS)})"
                )
            chosen[name] = (value, source)
    return chosen


def describe_training_defaults(config: TrainingConfig) -> str:
    """One line of the run's training defaults and where each came from, e.g. `"learning_rate 0.002 (preset
    itune-demo), ..., adam_beta2 0.999 (built-in)"`; values the command line or a recipe set say "(given)".

    Args:
        config: The run's settings.
    """
    sources = getattr(config, "defaults_from", {})
    return ", ".join(f"{name} {getattr(config, name)} ({sources.get(name, 'given')})" for name in TRAINING_DEFAULTS)


_FIELD_TYPES = {option.name: option.type for option in dataclasses.fields(TrainingConfig)}

__all__ = [
    "IDA_MASKING",
    "MIXED_PRECISION",
    "NUMBERS",
    "OBJECTIVES",
    "SCHEDULES",
    "SCST_BASELINES",
    "TASK_SCHEDULES",
    "TRAINING_DEFAULTS",
    "TrainingConfig",
    "describe_training_defaults",
    "reward_metric",
    "training_defaults",
]

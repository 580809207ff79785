"""Building what a run trains, by its model family (`ModelFamily.build_for_training`), and the feature cache it
reads."""

from __future__ import annotations

from .config import TrainingConfig

#: The families whose runs start from a trained model's weights (`--init-model`; `--objective scst` needs one).
INIT_MODEL_FAMILIES = ("ituning", "xgpt")


# ----------------------------------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------------------------------
def training_family(config: TrainingConfig):
    """The model family a run trains: its preset's, else `--family` (default: I-Tuning); see `itune_hf.models`."""
    from ..models import DEFAULT_FAMILY, get_family
    from ..presets import get_preset

    if config.preset:
        family = get_preset(config.preset).family
        if config.family and config.family != family.name:
            raise ValueError(f"--family {config.family} does not match the preset {config.preset} ({family.name})")
        return family
    return get_family(config.family or DEFAULT_FAMILY)


def build_training_model(config: TrainingConfig):
    """What the run trains, built by its model family: the model (only what learns requires grad), the base it
    wraps, the processor and the family's settings (an `itune_hf.models.TrainingModel`).

    Raises:
        ValueError: for options of another model family (e.g. `--num-heads`, an I-Tuning setting, for XGPT).
    """
    family = training_family(config)
    if config.preset and config.vision_model and not family.takes_vision_model:
        from ..models import families

        takers = " or ".join(f.title for f in families().values() if f.takes_vision_model)
        raise ValueError(
            f"--vision-model {config.vision_model} with --preset {config.preset}: only {takers} presets take other "
            f"weights for their vision tower ({config.preset} is {family.title}); drop one of them"
        )
    if config.init_model and family.name not in INIT_MODEL_FAMILIES:
        raise ValueError(
            f"--init-model {config.init_model}: {family.title} runs cannot start from a trained model (only "
            f"{', '.join(INIT_MODEL_FAMILIES)} presets); drop --init-model"
        )
    if config.load_in and not family.quantizes_frozen_lm:
        raise ValueError(_refuse_load_in(config.load_in, family))
    foreign = config.foreign_settings(family.name)
    if foreign:
        flags = ", ".join("--" + name.replace("_", "-") for name in foreign)
        raise ValueError(f"{flags}: not settings of {family.title} models (the run trains {family.name}); drop them")
    return family.load("build_for_training")(config)


def _refuse_load_in(load_in: str, family) -> str:
    """Why a run of `family` cannot load its LM in `load_in`, and what to do."""
    from ..models import families

    takers = " or ".join(f.title for f in families().values() if f.quantizes_frozen_lm)
    return (
        f"--load-in {load_in}: {family.title} runs do not quantise a language model (only {takers} runs do); drop "
        f"--load-in (full precision), or train {takers} on a quantised LM"
    )


def open_feature_cache(config: TrainingConfig, base, processor):
    """The `--feature-cache`, refused unless it matches the vision tower and image processor; None without one."""
    if not config.feature_cache:
        return None
    from ..vision.feature_cache import FeatureCache, read_fingerprint, vision_fingerprint

    dtype = read_fingerprint(config.feature_cache)["dtype"]
    expected = vision_fingerprint(base.vision_model, processor.image_processor, dtype)
    return FeatureCache(config.feature_cache, expected_fingerprint=expected)

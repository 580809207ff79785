"""I-Tuning as a PEFT adapter type: `get_peft_model(model, ITuningAdapterConfig(...))` after `import itune_hf`."""

from peft.utils import PeftType

from .registration import PEFT_TYPE_NAME, add_enum_member

# The enum member must exist before the config class can be instantiated (its __post_init__ sets peft_type).
add_enum_member(PeftType, PEFT_TYPE_NAME, PEFT_TYPE_NAME)

from .config import ITuningAdapterConfig  # noqa: E402
from .layer import ITuningLayer  # noqa: E402
from .model import ITuningTuner  # noqa: E402
from .registration import register_ituning_peft_type  # noqa: E402

register_ituning_peft_type()

__all__ = ["ITuningAdapterConfig", "ITuningLayer", "ITuningTuner", "register_ituning_peft_type"]

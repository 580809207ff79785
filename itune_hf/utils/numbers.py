"""Values checked where they enter: the kinds of numeric option (one definition per kind, used by the flags of every
command, `itune_hf.commands._options.number_type`, and by `TrainingConfig`, flags and recipe keys alike), and NaN or
infinite tensors refused where weights, features or averages are read (torch-free; numpy on use).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..errors import InputError


def non_finite_names(values: Any) -> list[str]:
    """The names of the tensors or arrays in `values` holding a NaN or an infinity (in order; integer ones never do).

    Args:
        values: A mapping of names to torch tensors or numpy arrays (a state dict, an `.npz`'s arrays).
    """
    import numpy as np

    found = []
    for name, value in values.items():
        if hasattr(value, "is_floating_point"):  # a torch tensor (any dtype, any device)
            bad = value.is_floating_point() and not bool(value.isfinite().all())
        else:
            array = np.asarray(value)
            bad = array.dtype.kind in "fc" and not bool(np.isfinite(array).all())
        if bad:
            found.append(str(name))
    return found


def check_finite(values: Any, where: str, hint: str) -> None:
    """Refuse NaN or infinite values where they enter (weights loaded, features read, a checkpoint averaged).

    Args:
        values: A mapping of names to tensors or arrays.
        where: What holds them, e.g. `"--init-model M/model.safetensors"`.
        hint: What to do.

    Raises:
        InputError: `"<where>: N of M tensors hold NaN or infinite values (e.g. a, b); <hint>"`.
    """
    bad = non_finite_names(values)
    if bad:
        raise InputError(
            f"{where}: {len(bad)} of {len(values)} tensors hold NaN or infinite values (e.g. {', '.join(bad[:3])}); "
            + hint
        )


@dataclass(frozen=True)
class Number:
    """A kind of numeric option: integer or real, with its bounds.

    Args:
        kind: `int` or `float`.
        minimum: The smallest accepted value (None: unbounded).
        maximum: The largest accepted value (None: unbounded).
        above: The minimum itself is refused (`> minimum`, e.g. a positive learning rate).
    """

    kind: type
    minimum: float | None = None
    maximum: float | None = None
    above: bool = False

    def describe(self) -> str:
        """What the option takes, e.g. `"an integer >= 1"`."""
        noun = "an integer" if self.kind is int else "a number"
        if self.minimum is not None and self.maximum is not None:
            return f"{noun} from {self.minimum} to {self.maximum}"
        if self.minimum is not None:
            return f"{noun} {'>' if self.above else '>='} {self.minimum}"
        return noun if self.maximum is None else f"{noun} <= {self.maximum}"

    def parse(self, value: Any) -> int | float:
        """`value` (a number, or its text: YAML reads `1e-4` as a string) as this kind, checked against the bounds.

        Args:
            value: The value given.

        Raises:
            ValueError: "expected <what>, got <value>".
        """
        number = _to_number(value, self.kind)
        low, high = self.minimum, self.maximum
        if (
            number is None
            or number != number  # NaN
            or number in (math.inf, -math.inf)  # inf trains to NaN weights (and 1e308 overflows just the same)
            or (low is not None and (number < low or (self.above and number == low)))
            or (high is not None and number > high)
        ):
            raise ValueError(f"expected {self.describe()}, got {value!r}")
        return number


def _to_number(value: Any, kind: type) -> int | float | None:
    if isinstance(value, bool):  # True is an int to Python, not a number to a user
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip()) if kind is float else int(value.strip().replace("_", ""))
        except ValueError:
            try:
                value = float(value)  # "1e3" as an integer option
            except ValueError:
                return None
    if isinstance(value, float) and kind is int:
        return int(value) if value.is_integer() else None
    if isinstance(value, int) and kind is float:
        return float(value)
    return value if isinstance(value, kind) else None


POSITIVE_INT = Number(int, 1)
NON_NEGATIVE_INT = Number(int, 0)
#: A beam size: more than 64 beams costs memory in proportion (100,000 asked for 20 GB) and no caption metric of the
#: papers improves past a few beams (I-Tuning decodes with 5, XGPT with 2)
BEAM_SIZE = Number(int, 1, 64)
POSITIVE_FLOAT = Number(float, 0, above=True)
NON_NEGATIVE_FLOAT = Number(float, 0)


__all__ = [
    "NON_NEGATIVE_FLOAT",
    "NON_NEGATIVE_INT",
    "POSITIVE_FLOAT",
    "POSITIVE_INT",
    "Number",
    "check_finite",
    "non_finite_names",
]

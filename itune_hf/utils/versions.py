"""The package's version, the dependency versions it was tested with, and one warning when an installed one is
outside them.

The ranges are written once, in `setup.cfg` (`install_requires`), and read here from the installed package's
metadata, so the warning and pip agree. The models override a few private methods of transformers' generation and
PEFT's adapter-type enum (see ARCHITECTURE.md, "Private hooks"): a release outside the tested range may change
them. Nothing here imports torch, transformers or PEFT: versions are read from the installed distributions.
"""

from __future__ import annotations

import importlib.metadata
import warnings

#: The package's version (`itune_hf.__version__`; setup.cfg reads it from here).
__version__ = "0.1.0"
#: The libraries whose internals the package relies on: a version outside the declared range is warned about.
CHECKED = ("transformers", "peft", "accelerate", "datasets")
DISTRIBUTION = "itune-hf"


def declared_ranges(distribution: str = DISTRIBUTION) -> dict[str, str]:
    """The version specifiers `setup.cfg` declares for the checked libraries, e.g. `{"transformers": ">=5.23,<5.25"}`.

    Args:
        distribution: The installed distribution whose requirements are read.

    Returns:
        An empty dict when the package is not installed (a bare source tree): nothing can be checked then.
    """
    from packaging.requirements import Requirement

    try:
        requirements = importlib.metadata.requires(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        return {}
    ranges = {}
    for line in requirements:
        requirement = Requirement(line)
        if requirement.marker is None and requirement.name in CHECKED:
            ranges[requirement.name] = str(requirement.specifier)
    return ranges


def untested_versions(ranges: dict[str, str] | None = None) -> dict[str, tuple[str, str]]:
    """The checked libraries installed outside their declared range: `name -> (installed version, range)`.

    Args:
        ranges: Specifiers by library; default: `declared_ranges()`.
    """
    from packaging.specifiers import SpecifierSet

    ranges = declared_ranges() if ranges is None else ranges
    outside = {}
    for name, specifier in sorted(ranges.items()):
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # pip installs it with the package; a missing one fails on first use with its own error
        if not SpecifierSet(specifier).contains(version, prereleases=True):
            outside[name] = (version, specifier)
    return outside


def warn_if_untested() -> None:
    """Warn once, naming each library and its tested range, when an installed version is outside it."""
    outside = untested_versions()
    if outside:
        found = "; ".join(f"{name} {version} (tested: {name}{spec})" for name, (version, spec) in outside.items())
        pins = " ".join(f"'{name}{spec}'" for name, (_, spec) in outside.items())
        warnings.warn(
            f"itune_hf was not tested with {found}. It may still work; if generation or loading fails, install a "
            f"tested version: pip install {pins}",
            UserWarning,
            stacklevel=3,
        )

"""Write the copies of `itune_hf/models/_shared/` that each model family carries for remote code.

    python tools/fix_copies.py           # (re)write every copy        (make fix-copies)
    python tools/fix_copies.py --check   # exit 1 naming each copy that differs from its source (the tests run this)

A checkpoint loaded with `trust_remote_code=True` where itune_hf is not installed has only the files its model file
imports from beside it, so each family folder holds a copy of the shared files it uses. `COPIES` says which; a copy
is its source under a "Generated from" header. Edit the source, then run this.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

MODELS = Path(__file__).resolve().parent.parent / "itune_hf" / "models"
SHARED = MODELS / "_shared"
#: shared file -> the family folders that carry a copy
COPIES: dict[str, tuple[str, ...]] = {
    "backbones.py": ("ituning", "xgpt"),
    "generation.py": ("clipcap", "crossattn", "ituning", "xgpt"),
    "images.py": ("ituning", "xgpt"),
    "text_inputs.py": ("ituning", "xgpt"),
    "caption_processing.py": ("ituning", "xgpt"),
}


def header(name: str) -> str:
    return (
        f"# Generated from itune_hf/models/_shared/{name} by `make fix-copies` (tools/fix_copies.py):\n"
        "# edit that file, not this copy. Remote code imports only the files beside the model file, so each family\n"
        "# carries one.\n"
    )


def expected_copies() -> dict[Path, str]:
    """Every copy's path and the text it must hold."""
    copies = {}
    for name, families in COPIES.items():
        text = header(name) + (SHARED / name).read_text(encoding="utf-8")
        for family in families:
            copies[MODELS / family / name] = text
    return copies


def stale_copies() -> list[Path]:
    """The copies that are missing or differ from their source."""
    return [path for path, text in expected_copies().items() if not path.exists() or path.read_text("utf-8") != text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only report copies that differ; change nothing")
    args = parser.parse_args(argv)
    stale = stale_copies()
    if args.check:
        for path in stale:
            print(f"{path.relative_to(MODELS.parent.parent)} differs from its source in _shared/", file=sys.stderr)
        if stale:
            print("run `make fix-copies` (edit the source in itune_hf/models/_shared/, not a copy)", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(expected_copies()[path], encoding="utf-8")
        print(f"wrote {path.relative_to(MODELS.parent.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

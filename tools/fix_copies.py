"""Write the copies of `itune_hf/models/_shared/` that each model family carries for remote code.

    python tools/fix_copies.py           # (re)write every copy        (make fix-copies)
    python tools/fix_copies.py --check   # exit 1 naming each copy that differs from its source (the tests run this)

A checkpoint loaded with `trust_remote_code=True` where itune_hf is not installed has only the files its model file
imports from beside it, so each family folder carries what it uses of `_shared/`, in one of two ways:

* a whole file: `COPIES` names the shared files and the families that carry them; a copy is its source under a
  "Generated from" header;
* one function or class (or method): a family file holds it under a marker naming its source, as transformers'
  `# Copied from` does:

      # Copied from itune_hf.models._shared.captioning.shift_tokens_right
      def shift_tokens_right(labels, pad_token_id, decoder_start_token_id):
          ...

  The block under the marker (its decorators included) must be the source's block, indented as the marker is.

Edit the source, then run this.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
import textwrap
from pathlib import Path

MODELS = Path(__file__).resolve().parent.parent / "itune_hf" / "models"
SHARED = MODELS / "_shared"
SHARED_PACKAGE = "itune_hf.models._shared"
#: shared file -> the family folders that carry a copy of the whole file
COPIES: dict[str, tuple[str, ...]] = {
    "backbones.py": ("ituning", "xgpt"),
    "generation.py": ("clipcap", "crossattn", "ituning", "xgpt"),
    "images.py": ("ituning", "xgpt"),
    "text_inputs.py": ("ituning", "xgpt"),
    "caption_processing.py": ("ituning", "xgpt"),
}
MARKER = re.compile(r"^(?P<indent>[ ]*)# Copied from (?P<source>[\w.]+)\s*$")


def header(name: str) -> str:
    return (
        f"# Generated from itune_hf/models/_shared/{name} by `make fix-copies` (tools/fix_copies.py):\n"
        "# edit that file, not this copy. Remote code imports only the files beside the model file, so each family\n"
        "# carries one.\n"
    )


def expected_copies() -> dict[Path, str]:
    """Every whole-file copy's path and the text it must hold."""
    copies = {}
    for name, families in COPIES.items():
        text = header(name) + (SHARED / name).read_text(encoding="utf-8")
        for family in families:
            copies[MODELS / family / name] = text
    return copies


# ------------------------------------------------------------------------------------------ copied blocks
def _block_lines(tree: ast.AST, qualname: str) -> tuple[int, int] | None:
    """The 1-based first (its first decorator) and last line of the definition `qualname` (`f`, `Class.method`)."""
    scope = tree
    node = None
    definitions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    for part in qualname.split("."):
        node = next((n for n in getattr(scope, "body", []) if isinstance(n, definitions) and n.name == part), None)
        if node is None:
            return None
        scope = node
    start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return start, node.end_lineno


def source_block(source: str) -> str:
    """The text of a shared definition, dedented (`itune_hf.models._shared.<module>.<qualname>`).

    Raises:
        ValueError: naming the marker's source when it is not a definition in `_shared/`.
    """
    if not source.startswith(SHARED_PACKAGE + "."):
        raise ValueError(f"# Copied from {source}: a copy's source lives in {SHARED_PACKAGE}")
    module, _, qualname = source.removeprefix(SHARED_PACKAGE + ".").partition(".")
    path = SHARED / f"{module}.py"
    if not path.is_file() or not qualname:
        raise ValueError(f"# Copied from {source}: no module {path.name} in _shared/, or no name after it")
    text = path.read_text(encoding="utf-8")
    lines = _block_lines(ast.parse(text), qualname)
    if lines is None:
        raise ValueError(f"# Copied from {source}: {path.name} defines no {qualname}")
    return textwrap.dedent("".join(text.splitlines(keepends=True)[lines[0] - 1 : lines[1]]))


def copied_blocks(path: Path) -> list[tuple[str, int, int, str]]:
    """The copied blocks of a family file: (source, first line, last line, indent) of each, lines 1-based."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    tree = ast.parse(text)
    starts = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            starts[min([node.lineno, *(d.lineno for d in node.decorator_list)])] = node.end_lineno
    blocks = []
    for number, line in enumerate(lines, 1):
        match = MARKER.match(line)
        if match is None:
            continue
        if number + 1 not in starts:
            raise ValueError(f"{path}:{number}: a '# Copied from' marker must sit right above a def or class")
        blocks.append((match["source"], number + 1, starts[number + 1], match["indent"]))
    return blocks


def expected_text(path: Path) -> str:
    """`path`'s text with every copied block replaced by its source."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    for source, first, last, indent in reversed(copied_blocks(path)):
        block = textwrap.indent(source_block(source), indent, lambda line: line.strip() != "")
        lines[first - 1 : last] = [block]
    return "".join(lines)


def family_files() -> list[Path]:
    """Every file of every family folder (the folders beside `_shared/`)."""
    return sorted(
        path for path in MODELS.glob("*/*.py") if path.parent.name != "_shared" and not path.parent.name.startswith(".")
    )


def block_families() -> dict[str, set[str]]:
    """Shared file (`captioning.py`) -> the family folders holding a block copied from it."""
    found: dict[str, set[str]] = {}
    for path in family_files():
        for source, *_ in copied_blocks(path):
            module = source.removeprefix(SHARED_PACKAGE + ".").partition(".")[0]
            found.setdefault(f"{module}.py", set()).add(path.parent.name)
    return found


def stale_copies() -> list[Path]:
    """The whole-file copies that are missing or differ from their source, and the family files whose copied blocks
    do."""
    stale = [path for path, text in expected_copies().items() if not path.exists() or path.read_text("utf-8") != text]
    for path in family_files():
        if path not in stale and copied_blocks(path) and expected_text(path) != path.read_text(encoding="utf-8"):
            stale.append(path)
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only report copies that differ; change nothing")
    args = parser.parse_args(argv)
    try:
        stale = stale_copies()
    except ValueError as error:
        print(error, file=sys.stderr)
        return 1
    if args.check:
        for path in stale:
            print(f"{path.relative_to(MODELS.parent.parent)} differs from its source in _shared/", file=sys.stderr)
        if stale:
            print("run `make fix-copies` (edit the source in itune_hf/models/_shared/, not a copy)", file=sys.stderr)
        return 1 if stale else 0
    whole = expected_copies()
    for path in stale:
        path.write_text(whole[path] if path in whole else expected_text(path), encoding="utf-8")
        print(f"wrote {path.relative_to(MODELS.parent.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

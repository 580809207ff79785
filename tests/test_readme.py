"""The README's usage snippets run as written (model path replaced by a tiny checkpoint)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import code_blocks, run_python_snippet, write_photo

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
THREE_WAYS = README[README.index("## Captioning: three ways in") : README.index("## The model")]


def test_readme_opens_with_the_two_commands():
    first_block = code_blocks(README, "bash")[0]
    assert [line.split("#")[0].strip() for line in first_block.strip().splitlines()] == ["make demo", "make test"]


@pytest.mark.parametrize("index", range(len(code_blocks(THREE_WAYS, "python"))))
@pytest.mark.parametrize("kind", ["adapter"])
def test_python_and_pipeline_snippets_run(index, kind, captioner_dirs, tmp_path):
    photo = write_photo(tmp_path / "photo.jpg")
    snippet = code_blocks(THREE_WAYS, "python")[index]
    out = run_python_snippet(
        snippet, {'"outputs/demo"': repr(str(captioner_dirs[kind])), '"photo.jpg"': repr(str(photo))}
    )
    assert out.count("[") >= 1 and out.strip()


def test_command_line_snippet_runs(captioner_dirs, tmp_path):
    (command,) = code_blocks(THREE_WAYS, "bash")
    write_photo(tmp_path / "photo.jpg")
    (tmp_path / "more_photos").mkdir()
    write_photo(tmp_path / "more_photos" / "b.png")
    args = shlex.split(command.replace("outputs/demo", str(captioner_dirs["adapter"])))
    args[0] = str(Path(sys.executable).parent / "itune")
    result = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.strip().splitlines()
    assert [line.split("\t")[0] for line in lines] == ["photo.jpg", str(Path("more_photos") / "b.png")]

"""The README's usage snippets run as written (model path replaced by a tiny checkpoint)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import code_blocks, run_python_snippet, write_photo

pytestmark = pytest.mark.slow  # learning runs, subprocesses, kills or benchmarks: make test-fast skips them

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
THREE_WAYS = README[README.index("## Captioning: three ways in") : README.index("## Data, training, evaluation")]
DATA = README[README.index("## Data, training, evaluation") : README.index("## The model")]


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


def test_data_training_evaluation_commands_run_as_written_at_a_tiny_size(tmp_path):
    import json

    from itune_hf.data import load_captions

    (block,) = code_blocks(DATA, "bash")
    script = (
        block.replace("--num-images 2000", "--num-images 40 --image-size 32")
        .replace("itune-demo", "itune-tiny-random")
        .replace("--max-steps 300", "--max-steps 2 --batch-size 4 --eval-split none --report-to none")
        .replace("--num-beams 5", "--num-beams 1 --max-new-tokens 4 --metrics BLEU,ROUGE_L,CIDEr")
        .replace("results.json captions_val2014.json", "outputs/mine/eval-test/results.json refs.json --metrics CIDEr")
    )
    assert script.count("tiny-random") == 2 and "--max-steps 2" in script and "--metrics CIDEr" in script
    *commands, score_command = [line for line in script.replace("\\\n", " ").splitlines() if line.strip()]
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path)}

    def bash(command: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env
        )

    for command in commands:
        result = bash(command)
        assert result.returncode == 0, (command, result.stderr[-3000:])
    test = load_captions(str(tmp_path / "data" / "world" / "dataset.json"))["test"]
    references = {
        "images": [{"id": i} for i in test["image_id"]],
        "annotations": [
            {"image_id": i, "caption": c} for i, refs in zip(test["image_id"], test["captions"]) for c in refs
        ],
    }
    (tmp_path / "refs.json").write_text(json.dumps(references))
    scored = bash(score_command)
    assert scored.returncode == 0, scored.stderr[-3000:]
    printed = json.loads(scored.stdout.strip().splitlines()[-1])
    evaluated = json.loads((tmp_path / "outputs" / "mine" / "eval-test" / "metrics.json").read_text())
    assert printed["CIDEr"] == evaluated["scores"]["CIDEr"]

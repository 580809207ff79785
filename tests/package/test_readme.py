"""The README and docs/: every command they show runs (at a tiny size), or at least parses with the `itune` CLI, and
every figure they quote is the one its record in benchmarks/records/ holds (docs/figures.md)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import code_blocks, run_python_snippet, write_photo

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
DOCS = {path.name: path.read_text() for path in sorted((ROOT / "docs").glob("*.md"))}
RECORDS = {path.stem: json.loads(path.read_text()) for path in (ROOT / "benchmarks" / "records").glob("*.json")}
BIN = Path(sys.executable).parent


def section(text: str, heading: str) -> str:
    """The text of one `## heading` section (up to the next `## `)."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def command_lines(text: str) -> list[str]:
    """The commands of a markdown text's bash blocks, continuation lines joined, comments dropped."""
    lines = []
    for block in code_blocks(text, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            command = line.split("  #")[0].split(" # ")[0].strip()
            if command and not command.startswith("#"):
                lines.append(" ".join(command.split()))
    return lines


def tiny(text: str, replacements: dict[str, str]) -> str:
    """`text` with each replacement made; a replacement that finds nothing means the README changed under the test."""
    for old, new in replacements.items():
        assert old in text, f"the README no longer has {old!r}: update the test's tiny-size replacements"
        text = text.replace(old, new)
    return text


def run_commands(commands: list[str], cwd: Path) -> list[subprocess.CompletedProcess]:
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(cwd), "TRANSFORMERS_VERBOSITY": "error"}
    results = []
    for command in commands:
        result = subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=600, env=env)
        assert result.returncode == 0, (command, result.stderr[-3000:])
        results.append(result)
    return results


# ------------------------------------------------------------------------------------------------------ first screen
def test_readme_opens_with_the_two_commands_and_is_short():
    first_block = code_blocks(README, "bash")[0]
    assert [line.split("#")[0].strip() for line in first_block.strip().splitlines()] == ["make demo", "make test"]
    assert len(README.splitlines()) <= 250
    first_screen = README[: README.index("\n## ")]
    assert "pip install ." in first_screen and "No trained checkpoint ships" in first_screen
    (caption_example,) = code_blocks(first_screen, "python")
    assert len(caption_example.strip().splitlines()) <= 6


# Commands shown but not run by a test, each with the reason; everything else in a README bash block runs below.
NOT_RUN = {
    "make demo": "the whole demo: tests/commands/test_demo.py runs a smaller `itune demo`",
    "make test": "the suite itself",
    "make test-slow": "the suite itself",
    "make quality": "ruff",
    "pip install .": "installs",
    'pip install ".[app]"': "installs",
    "itune serve --model outputs/demo --port 7860": "a server: tests/test_app.py serves the page",
}
RUN_SECTIONS = ("Captioning", "Training and evaluation", "The model and the presets", "XGPT")


def test_every_readme_command_runs_in_a_test_or_is_listed_with_the_reason():
    run = {line for heading in RUN_SECTIONS for line in command_lines(section(README, heading))}
    assert set(command_lines(README)) - run == set(NOT_RUN)


@pytest.mark.parametrize("page", ["README.md", *DOCS])
def test_every_itune_command_shown_parses_with_the_cli(page):
    from itune_hf.cli import build_parser

    parser = build_parser()
    text = README if page == "README.md" else DOCS[page]
    for line in command_lines(text):
        if line.startswith("itune "):
            try:
                parser.parse_args(shlex.split(line)[1:])
            except SystemExit:
                pytest.fail(f"{page}: `{line}` does not parse with the itune CLI")


# ---------------------------------------------------------------------------------------------------- runs, tiny
@pytest.mark.slow
def test_the_caption_example_and_the_moved_pipeline_snippets_run(captioner_dirs, tmp_path):
    photo = write_photo(tmp_path / "photo.jpg")
    replacements = {'"outputs/demo"': repr(str(captioner_dirs["adapter"])), '"photo.jpg"': repr(str(photo))}
    captioning = section(DOCS["captioning.md"], "Captioning: three ways in")
    snippets = code_blocks(README, "python")[:1] + code_blocks(captioning, "python")
    assert len(snippets) == 3
    for snippet in snippets:
        out = run_python_snippet(snippet, replacements)
        assert out.count("[") >= 1 and out.strip()


@pytest.mark.slow
def test_captioning_commands_run(captioner_dirs, tmp_path):
    write_photo(tmp_path / "photo.jpg")
    (tmp_path / "more_photos").mkdir()
    write_photo(tmp_path / "more_photos" / "b.png")
    caption, explain = command_lines(section(README, "Captioning"))
    caption, explain = (c.replace("outputs/demo", str(captioner_dirs["adapter"])) for c in (caption, explain))
    captioned, _ = run_commands([caption, explain], tmp_path)
    lines = captioned.stdout.strip().splitlines()
    assert [line.split("\t")[0] for line in lines] == ["photo.jpg", str(Path("more_photos") / "b.png")]
    assert (tmp_path / "heat.png").stat().st_size > 0


@pytest.mark.slow
def test_data_training_evaluation_commands_run_as_written_at_a_tiny_size(tmp_path):
    from itune_hf.data import load_captions

    script = tiny(
        "\n".join(command_lines(section(README, "Training and evaluation"))),
        {
            "--num-images 2000": "--num-images 40 --image-size 32",
            "itune-demo": "itune-tiny-random",
            "--max-steps 300": "--max-steps 2 --batch-size 4 --eval-split none --report-to none",
            "--split test": "--split test --num-beams 1 --max-new-tokens 4 --metrics BLEU,ROUGE_L,CIDEr",
            "results.json captions_val2014.json": "outputs/mine/eval-test/results.json refs.json --metrics CIDEr",
        },
    )
    *commands, score_command = script.splitlines()
    run_commands(commands, tmp_path)
    test = load_captions(str(tmp_path / "data" / "world" / "dataset.json"))["test"]
    references = {
        "images": [{"id": i} for i in test["image_id"]],
        "annotations": [
            {"image_id": i, "caption": c} for i, refs in zip(test["image_id"], test["captions"]) for c in refs
        ],
    }
    (tmp_path / "refs.json").write_text(json.dumps(references))
    (scored,) = run_commands([score_command], tmp_path)
    printed = json.loads(scored.stdout.strip().splitlines()[-1])
    evaluated = json.loads((tmp_path / "outputs" / "mine" / "eval-test" / "metrics.json").read_text())
    assert printed["CIDEr"] == evaluated["scores"]["CIDEr"]


@pytest.mark.slow
def test_params_commands_print_the_recorded_counts(tmp_path):
    commands = [line for line in command_lines(README) if line.startswith("itune params")]
    assert len(commands) == 2
    counts = RECORDS["parameters"]["counts"]
    for command, result in zip(commands, run_commands(commands, tmp_path)):
        assert int(result.stdout.strip().splitlines()[-1]) == counts[command.split("--preset ")[1].split()[0]]


XGPT_TINY = {
    "xgpt-demo-resnet": "xgpt-tiny-random",
    "itune train --preset xgpt-tiny-random": "itune train --preset xgpt-tiny-random --batch-size 4 --report-to none "
    "--eval-max-images 4",
    "--data synthetic": "--data data/world/dataset.json",
    "--split test": "--split test --max-new-tokens 4",
    "--world alt-text --output-dir data/alt-text": "--world alt-text --output-dir data/alt-text --num-images 24 "
    "--image-size 32",
    "--max-steps 300 --save-every 75 --eval-every 75": "--max-steps 4 --save-every 1 --eval-every 1",
    "--max-steps 60 --save-every 15 --eval-every 15": "--max-steps 4 --save-every 1 --eval-every 1",
    "--max-steps 300": "--max-steps 2",
    "--output-dir outputs/finetuned": "--output-dir outputs/finetuned --max-steps 2",
}


@pytest.mark.slow
def test_xgpt_commands_run_as_written_at_a_tiny_size(tmp_path):
    commands = [line for line in command_lines(section(README, "XGPT")) if not line.startswith("itune params")]
    world = "itune make-synthetic --output-dir data/world --num-images 24 --image-size 32"
    run_commands([world, *tiny("\n".join(commands), XGPT_TINY).splitlines()], tmp_path)
    for stage in ("stage1", "stage2"):  # each stage kept the 4 checkpoints its average takes
        assert len(list((tmp_path / "outputs" / stage / "checkpoints").glob("step-*"))) == 4
    assert (tmp_path / "outputs" / "finetuned" / "config.json").is_file()
    assert json.loads((tmp_path / "outputs" / "xgpt" / "eval-test" / "metrics.json").read_text())["scores"]


def test_the_readme_lists_as_tested_exactly_the_decoders_a_test_runs():
    import importlib.util

    path = ROOT / "tests" / "models" / "test_decoder_architectures.py"
    spec = importlib.util.spec_from_file_location("decoder_architectures", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert set(module.NAMES) == set(module.TINY_DECODERS)
    text = " ".join(section(README, "The model and the presets").split())
    tested = text[text.index("Decoders:") : text.index("are tested from tiny random configs")]
    named = set(re.findall(r"[A-Z][\w-]*", tested))
    assert named == {"Decoders", "GPT-2", "Llama", "SmolLM2-135M", *module.NAMES.values()}
    assert "other LMs are looked for by discovery, untested" in text


# ----------------------------------------------------------------------------------------------- figures vs records
def _all_text() -> str:
    cards = "".join(path.read_text() for path in sorted((ROOT / "model_cards").glob("*.md")))
    return README + "".join(DOCS.values()) + cards


def test_parameter_counts_record_is_what_the_presets_build():
    sys.path.insert(0, str(ROOT / "tools"))
    from records import parameter_counts

    assert RECORDS["parameters"]["counts"] == parameter_counts(), "run python tools/records.py parameters"


def test_the_demo_record_is_written_from_a_demo_run(tmp_path):
    sys.path.insert(0, str(ROOT / "tools"))
    from records import write_demo

    (tmp_path / "demo.json").write_text(json.dumps(RECORDS["demo"]))
    scores = {"CIDEr": 1.23449, "Bleu_4": 0.3, "ROUGE_L": 0.6, "Object_F1": 0.25}
    train = {"steps": 90, "captions_seen": 2880, "mixed_precision": "no"}  # as training records fp32
    (tmp_path / "demo_results.json").write_text(
        json.dumps({"train": train, "test": {"adapter": scores}, "seconds": 480.4})
    )
    write_demo(tmp_path, records=tmp_path)
    record = json.loads((tmp_path / "demo.json").read_text())
    latest = record["latest"]
    assert latest["scores"] == {"adapter": {"CIDEr": 1.234, "BLEU-4": 0.3, "ROUGE-L": 0.6, "object F1": 0.25}}
    assert (latest["steps"], latest["whole_demo_seconds"], latest["precision"]) == (90, 480, "fp32")
    assert latest["hardware"] and latest["threads"] >= 1 and latest["date"]
    # the run that was latest is kept, first among the earlier ones
    assert record["earlier"] == [RECORDS["demo"]["latest"], *RECORDS["demo"]["earlier"]]


def test_every_parameter_count_quoted_is_a_recorded_one():
    recorded = {f"{count:,}" for count in RECORDS["parameters"]["counts"].values()}
    quoted = set(re.findall(r"\b\d{1,3}(?:,\d{3}){2,}\b", _all_text()))
    assert quoted and quoted <= recorded, f"not in benchmarks/records/parameters.json: {sorted(quoted - recorded)}"


def test_a_table_row_naming_a_preset_quotes_that_presets_own_count():
    """Each count in a table row that starts with a preset's name is that preset's (or one of its XGPT
    architectures'), so two presets' counts swapped fail here though both are recorded."""
    counts = RECORDS["parameters"]["counts"]
    checked = 0
    for line in _all_text().splitlines():
        match = re.match(r"\| `([a-z0-9.-]+)`", line)
        if not match or match[1] not in counts:
            continue
        own = {f"{value:,}" for name, value in counts.items() if name.split("/")[0] == match[1]}
        quoted = set(re.findall(r"\b\d{1,3}(?:,\d{3}){2,}\b", line))
        assert quoted <= own, f"{line}: {sorted(quoted - own)} are not {match[1]}'s counts ({sorted(own)})"
        checked += len(quoted)
    assert checked >= 13  # the README's and docs/model.md's preset tables, docs/xgpt.md's architectures


def _duration(seconds: int) -> str:
    return f"{seconds // 60} min {seconds % 60:02d} s"


def _table_rows(text: str, after: str) -> list[list[str]]:
    """The cells of the data rows of the first table at or after `after` (a table's header line, or text above it)."""
    rest = text[text.index(after) :]
    rows = (rest if rest.startswith("|") else rest[rest.index("\n|") :]).split("\n\n")[0].strip().splitlines()
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]]


def test_the_readme_quotes_the_demo_record():
    demo = RECORDS["demo"]
    latest = demo["latest"]
    rows = _table_rows(README, "**`make demo`**")
    assert len(rows) == len(latest["scores"])
    for row, scores in zip(rows, latest["scores"].values()):
        assert row[1:] == [f"{scores[name]:.3f}" for name in ("CIDEr", "BLEU-4", "object F1")], row
    heading = " ".join(README[README.index("**`make demo`**") :].split("\n\n")[0].split())
    for fact in (
        f"{latest['threads']} threads, {latest['precision']}, {latest['date']}",
        f"{latest['steps']} training steps ({latest['captions_seen']:,} captions)",
        _duration(latest["whole_demo_seconds"]),
        "not emulated" if not latest["emulated"] else "emulated",
    ):
        assert fact in heading, fact
    constant = demo["constant_caption"]["scores"]
    quoted = (
        f"constant caption scores CIDEr {constant['CIDEr']:.3f} on this world (object F1 {constant['object F1']:.3f})"
    )
    assert quoted in " ".join(README.split())


def test_the_demo_page_quotes_every_recorded_demo_run():
    demo = RECORDS["demo"]
    rows = _table_rows(DOCS["demo.md"], "| date | CPU")
    runs = [demo["latest"], *demo["earlier"]]
    assert len(rows) == len(runs)
    for row, run in zip(rows, runs):
        assert row[0] == (run["date"] or "not recorded")
        assert ("emulating" in row[1]) == run["emulated"]
        assert row[3].startswith(run["precision"]) and row[4] == f"{run['steps']} ({run['captions_seen']:,})"
        assert row[5].strip("*") == _duration(run["whole_demo_seconds"])
        adapter = run["scores"]["adapter"]
        assert row[6].replace("*", "") == f"{adapter['CIDEr']:.3f} / {adapter['BLEU-4']:.3f}"
        assert row[7] == f"{run['scores']['adapter disabled']['CIDEr']:.3f}"


def test_the_readme_quotes_the_speed_record():
    rows = _table_rows(README, "**Speed**")
    ratios = RECORDS["speed"]["ratios"].values()
    assert len(rows) == len(ratios)
    for row, ratio in zip(rows, ratios):
        assert row[1].startswith(ratio["value"]) and ratio["date"] in row[2], row
        assert f"{ratio['threads']} thread" in row[2] or f"{ratio['threads']} process" in row[2], row
        assert ratio["hardware"].split(",")[0] in row[2], row
        assert (ROOT / ratio["results"].split("#")[0]).is_file() and ratio["value"] in (
            ROOT / "benchmarks" / "RESULTS.md"
        ).read_text()


def test_the_xgpt_page_quotes_the_xgpt_record():
    scores = RECORDS["xgpt-demo"]["latest"]["scores"]
    rows = _table_rows(DOCS["xgpt.md"], "| captions | CIDEr | object F1 | exact scenes |")
    assert len(rows) == len(scores)
    for row, values in zip(rows, scores.values()):
        assert row[1].strip("*") == f"{values['CIDEr']:.3f}" and row[2] == f"{values['object F1']:.3f}", row


def test_the_scale_plan_quotes_the_gpu_record():
    """docs/scale.md's measured table is the record of the lent-GPU run (ms/step, captions/s, peak memory)."""
    record = RECORDS["scale-h200"]
    rows = {(row[0], row[1]): row for row in _table_rows(DOCS["scale.md"], "| workload | batch per GPU |")}
    names = {"itune-features": "I-Tuning GPT-2 large, cached tower states", "xgpt-features": "XGPT Base, cached "
             "tower states, IC", "itune-images": "I-Tuning GPT-2 large, tower in the step"}  # fmt: skip
    quoted = 0
    for run in ("batch_64", "batch_512"):
        for measured in record[run]["rows"]:
            row = rows.get((names.get(measured["workload"]), str(measured.get("batch"))))
            if row is None:
                continue
            quoted += 1
            assert row[2] == f"{measured['ms_per_step']:.1f}", row
            assert row[3] == f"{measured['captions_per_s']:,.0f}", row
            assert row[4] == f"{measured['peak_memory_bytes'] / 1e9:.1f} GB", row
    assert quoted == 5 and record["batch_64"]["machine"]["device"] == "NVIDIA H200"

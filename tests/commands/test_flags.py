"""One spelling per flag: help texts name only options that exist, and renamed flags keep their old spelling as a
hidden alias (accepted, not shown by --help; two spellings of one option are an error). Commands run as a user runs
them: `itune_hf.cli.main([...])` or the console script."""

from __future__ import annotations

import argparse
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from itune_hf.cli import COMMANDS, build_parser, main

ITUNE = Path(sys.executable).parent / "itune"

# (command, old spelling) -> the option it is an alias of
RENAMED = {
    ("make-synthetic", "--output"): "--output-dir",
    ("make-photos", "--output"): "--output-dir",
    ("make-clipart", "--output"): "--output-dir",
    ("make-shards", "--output"): "--output-dir",
    ("cache-features", "--output"): "--output-dir",
    ("make-datastore", "--output"): "--output-dir",
    ("demo", "--output"): "--output-dir",
    ("demo", "--steps"): "--max-steps",
    ("train", "--split"): "--train-split",  # train reads two splits; --split is what the one-split commands say
}

FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
# `itune X` then command-line words (flags, METAVARS, <placeholders>, paths, numbers): flags there are options of X
WORD = r"(?:--[a-z][a-z0-9-]*|[A-Z<][^\s,;()]*|[^\s,;()]*[/.\d][^\s,;()]*)"
OTHER_COMMAND = re.compile(rf"\bitune ([a-z][a-z-]*)((?: +{WORD})*)")


def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def visible_options(parser: argparse.ArgumentParser) -> set[str]:
    return {flag for a in parser._actions if a.help != argparse.SUPPRESS for flag in a.option_strings}


def help_texts(parser: argparse.ArgumentParser, command_help: str = "") -> list[str]:
    """Every text `--help` shows: the command's HELP/description, epilog, group titles and descriptions, and the
    help of each option."""
    texts = [command_help, parser.description, parser.epilog]
    texts += [text for group in parser._action_groups for text in (group.title, group.description)]
    texts += [a.help for a in parser._actions if a.help != argparse.SUPPRESS]
    return [" ".join(text.split()) for text in texts if text]


def unknown_flags(text: str, command: str, parsers: dict[str, argparse.ArgumentParser]) -> list[str]:
    """The flags `text` names that are not a (visible) option of `command`, or of `itune X` where it says so."""
    problems, elsewhere = [], []
    for match in OTHER_COMMAND.finditer(text):
        other = match.group(1)
        elsewhere.append(match.span(2))
        for flag in FLAG.findall(match.group(2)):
            if other not in parsers or flag not in visible_options(parsers[other]):
                problems.append(f"itune {other} {flag}")
    for match in FLAG.finditer(text):
        inside = any(start <= match.start() < end for start, end in elsewhere)
        if not inside and match.group() not in visible_options(parsers[command]):
            problems.append(match.group())
    return problems


def test_the_checker_finds_a_flag_that_does_not_exist():
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", help="Preset name, e.g. itune-gpt2-large (see --list).")
    parser.add_argument("--data", help="See itune eval --split and itune eval --nope; --preset, --data.")
    parsers = {"params": parser, "eval": subparsers()["eval"]}
    assert [p for text in help_texts(parser) for p in unknown_flags(text, "params", parsers)] == [
        "--list",
        "itune eval --nope",
    ]


@pytest.mark.parametrize("command", COMMANDS)
def test_help_names_only_options_that_exist(command):
    parsers = subparsers()
    command_help = importlib.import_module(f"itune_hf.commands.{COMMANDS[command]}").HELP
    problems = {
        text: unknown_flags(text, command, parsers)
        for text in help_texts(parsers[command], command_help)
        if unknown_flags(text, command, parsers)
    }
    assert not problems, f"itune {command} --help names options it does not have: {problems}"


def test_every_hidden_option_is_a_declared_alias_of_a_shown_one():
    hidden = {}
    for command, parser in subparsers().items():
        for action in parser._actions:
            if action.help == argparse.SUPPRESS and action.option_strings:
                (flag,) = action.option_strings
                hidden[command, flag] = action.dest
    assert set(hidden) == set(RENAMED)
    for (command, old), new in RENAMED.items():
        (target,) = [a for a in subparsers()[command]._actions if new in a.option_strings]
        assert hidden[command, old] == target.dest and target.help != argparse.SUPPRESS


@pytest.mark.parametrize(("command", "old"), RENAMED)
def test_old_spelling_is_hidden_from_help(command, old, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    shown = capsys.readouterr().out
    usage, options = shown.split("\n\n")[0], re.findall(r"^ +(--?[\w-]+)", shown, flags=re.MULTILINE)
    assert RENAMED[command, old] in options
    assert old not in options and not re.search(rf"{old}(?![\w-])", usage), shown


@pytest.mark.parametrize(("command", "old"), RENAMED)
def test_two_spellings_of_one_option_are_an_error(command, old, capsys):
    new = RENAMED[command, old]
    for argv in ([old, "1", new, "2"], [new, "1", old, "2"]):
        with pytest.raises(SystemExit) as exit_:
            main([command, *argv])
        assert exit_.value.code == 2
        assert "not allowed with argument" in capsys.readouterr().err


def test_make_synthetic_old_output_spelling_writes_the_same_world(tmp_path):
    for flag in ("--output", "--output-dir"):
        result = subprocess.run(
            [str(ITUNE), "make-synthetic", flag, str(tmp_path / flag), "--num-images", "6", "--seed", "4"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr
    old, new = (json.loads((tmp_path / flag / "dataset.json").read_text()) for flag in ("--output", "--output-dir"))
    assert old == new and len(new["images"]) == 6
    both = subprocess.run(
        [str(ITUNE), "make-synthetic", "--output", str(tmp_path / "a"), "--output-dir", str(tmp_path / "b")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert both.returncode == 2 and "argument --output-dir: not allowed with argument --output" in both.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_make_photos_old_output_spelling(tmp_path):
    assert main(["make-photos", "--output", str(tmp_path / "photos")]) == 0
    assert (tmp_path / "photos" / "dataset.json").is_file()


def test_cache_features_old_output_spelling(tmp_path, capsys):
    assert main(["make-synthetic", "--output-dir", str(tmp_path / "world"), "--num-images", "3"]) == 0
    argv = ["cache-features", "--preset", "itune-tiny-random", "--data", str(tmp_path / "world")]
    assert main([*argv, "--output", str(tmp_path / "cache")]) == 0
    assert "cached 3 images" in capsys.readouterr().out
    assert len(list((tmp_path / "cache").glob("shard-*.safetensors"))) == 1


def test_demo_old_spellings_set_the_new_options():
    args = build_parser().parse_args(["demo", "--output", "adapter", "--steps", "7"])
    assert (args.output_dir, args.max_steps) == ("adapter", 7)
    defaults = build_parser().parse_args(["demo"])
    assert (defaults.output_dir, defaults.max_steps) == ("outputs/demo", 300)


def test_train_split_is_the_training_split():
    from itune_hf.commands.train import config_from_args

    config = config_from_args(build_parser().parse_args(["train", "--output-dir", "run", "--split", "test"]))
    assert (config.train_split, config.eval_split) == ("test", "val")
    assert config_from_args(build_parser().parse_args(["train", "--output-dir", "run"])).train_split == "train"

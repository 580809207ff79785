"""`itune params`: the paper's Table 1 trainable-parameter counts, printed exactly; random backbones named as such."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from itune_hf.cli import main
from itune_hf.presets import get_preset, list_presets

PAPER_TABLE = {  # Table 1 of the paper: 14M / 44M / 95M / 47M
    "itune-gpt2-base": 14178816,
    "itune-gpt2-medium": 44101632,
    "itune-gpt2-large": 94487040,
    "itune-gpt2-large-drop18": 47243520,
}


def formula(d: int, layers: int, dv: int = 768) -> int:
    r = d // 2
    return layers * ((d * r + r) + 2 * (dv * r + r) + (r * d + d))


def test_paper_presets_are_registered():
    assert set(PAPER_TABLE) <= set(list_presets())
    assert get_preset("itune-gpt2-large-drop18").settings == {"first_layer": 18}
    assert get_preset("itune-gpt2-base").vision.hub_id == "openai/clip-vit-base-patch16"
    assert [get_preset(p).text.hub_id for p in PAPER_TABLE] == ["gpt2", "gpt2-medium", "gpt2-large", "gpt2-large"]


@pytest.mark.parametrize(("preset", "expected"), PAPER_TABLE.items())
def test_params_prints_the_paper_count_on_its_last_line(preset, expected, capsys):
    assert main(["params", "--preset", preset]) == 0
    last_line = capsys.readouterr().out.strip().splitlines()[-1]
    assert last_line == str(expected)


def test_counts_follow_the_module_formula():
    assert PAPER_TABLE["itune-gpt2-base"] == formula(768, 12)
    assert PAPER_TABLE["itune-gpt2-medium"] == formula(1024, 24)
    assert PAPER_TABLE["itune-gpt2-large"] == formula(1280, 36)
    assert PAPER_TABLE["itune-gpt2-large-drop18"] == formula(1280, 18)


def test_overrides_change_the_count(capsys):
    assert main(["params", "--preset", "itune-gpt2-base", "--first-layer", "6", "--bottleneck-dim", "128"]) == 0
    r, d = 128, 768
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(6 * ((d * r + r) + 2 * (768 * r + r) + (r * d + d)))


@pytest.mark.slow
def test_console_script_as_a_user_runs_it():
    itune = Path(sys.executable).parent / "itune"
    result = subprocess.run(
        [str(itune), "params", "--preset", "itune-gpt2-large-drop18"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "47243520"
    bad = subprocess.run([str(itune), "params", "--preset", "itune-gpt3"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.strip() == (
        "itune params: error: Unknown preset 'itune-gpt3'; known presets: " + ", ".join(list_presets())
    )


def test_list_names_every_preset_with_its_description(capsys):
    assert main(["params", "--list"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split()[0] for line in lines] == list_presets()
    for line in lines:
        name, description = line.split(maxsplit=1)
        assert description == get_preset(name).description


def test_preset_or_list_is_required_and_list_takes_no_override(capsys):
    with pytest.raises(SystemExit) as neither:
        main(["params"])
    assert neither.value.code == 2
    assert "one of the arguments --preset --list is required" in capsys.readouterr().err
    with pytest.raises(SystemExit) as both:
        main(["params", "--list", "--preset", "itune-demo"])
    assert both.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
    assert main(["params", "--list", "--first-layer", "3"]) == 2
    assert capsys.readouterr().err == (
        "itune params: error: --first-layer and --bottleneck-dim apply to --preset, not to --list\n"
    )


def test_list_as_a_user_runs_it_imports_no_torch():
    script = "import sys; from itune_hf.cli import main; main(['params', '--list']); print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].startswith(list_presets()[0] + " ")
    assert result.stdout.splitlines()[-1] == "False"


def test_itune_params_names_random_backbones(capsys):
    assert main(["params", "--preset", "itune-tiny-random"]) == 0
    out = capsys.readouterr().out
    assert "None" not in out and "vision: random (preset config" in out and "text: random (preset config" in out

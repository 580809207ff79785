"""How `itune` speaks when things go wrong: Ctrl-C in any command but `train` (which saves a checkpoint first:
tests/training) ends with one line and exit status 130, as a shell reports an interrupted program; a beam size past
its bound is refused when parsed and an allocation failure is one line; the package's warnings are one line each,
not Python's warning format with an install path."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


def test_ctrl_c_during_eval_is_one_line_and_exit_130(tmp_path):
    # eval is interrupted where it loads the model (a real KeyboardInterrupt, raised as SIGINT would raise it)
    script = textwrap.dedent(
        """
        import signal, sys
        import itune_hf.commands._models as command
        from itune_hf.cli import main

        def interrupted(*args, **kwargs):
            signal.signal(signal.SIGINT, signal.default_int_handler)  # a test worker's child may inherit it ignored
            signal.raise_signal(signal.SIGINT)

        command.check_model_argument = command.load_model_argument = interrupted
        sys.exit(main(["eval", "--model", "itune-tiny-random", "--data", "x.json", "--output-dir", "out"]))
        """
    )
    (tmp_path / "x.json").write_text(
        '{"images": [{"filename": "a.png", "split": "test", "sentences": [{"raw": "a"}]}]}'
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 130, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == "itune eval: interrupted (Ctrl-C)"
    assert "Traceback" not in result.stderr


def test_a_beam_size_past_the_bound_is_refused_when_parsed_and_an_allocation_failure_is_one_line(capsys):
    from itune_hf.cli import main
    from itune_hf.errors import error_message

    with pytest.raises(SystemExit) as parsed:  # argparse's own exit
        main(["caption", "x.png", "--model", "m", "--num-beams", "100000"])
    assert parsed.value.code == 2
    assert "argument --num-beams: expected an integer from 1 to 64, got '100000'" in capsys.readouterr().err
    failed = RuntimeError("[enforce fail at alloc_cpu.cpp:121] DefaultCPUAllocator: can't allocate memory: you tried "
                          "to allocate 21474836480 bytes. Error code 12 (Cannot allocate memory)")  # fmt: skip
    for error in (failed, MemoryError()):
        message = error_message(error)
        assert message.startswith("out of memory (") and "lower --batch-size, --num-beams" in message
    assert error_message(RuntimeError("a bug")) is None  # any other RuntimeError keeps its traceback


def test_the_packages_warnings_are_one_line_without_an_install_path(tmp_path):
    from PIL import Image

    Image.new("RGB", (32, 32)).save(tmp_path / "a.png")
    images = [
        {"filename": name, "split": "test", "sentences": [{"raw": "a caption"}]} for name in ("a.png", "gone.png")
    ]
    (tmp_path / "d.json").write_text(__import__("json").dumps({"images": images}))
    argv = ["make-shards", "--data", str(tmp_path / "d.json"), "--split", "test", "--output-dir", str(tmp_path / "s")]
    result = subprocess.run([sys.executable, "-m", "itune_hf.cli", *argv], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    warned = [line for line in result.stderr.splitlines() if "gone.png" in line]
    assert warned == [f"warning: {tmp_path / 'd.json'}: 1 of 2 images are missing or unusable, skipped: "
                      f"{tmp_path / 'gone.png'} (no such file)."]  # fmt: skip

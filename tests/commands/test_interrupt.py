"""Ctrl-C in any command but `train` (which saves a checkpoint first: tests/training) ends with one line and exit
status 130, as a shell reports an interrupted program, not with a traceback."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_ctrl_c_during_eval_is_one_line_and_exit_130(tmp_path):
    # eval is interrupted where it loads the model (a real KeyboardInterrupt, raised as SIGINT would raise it)
    script = textwrap.dedent(
        """
        import signal, sys
        import itune_hf.commands._models as command
        from itune_hf.cli import main

        def interrupted(*args, **kwargs):
            signal.raise_signal(signal.SIGINT)

        command.check_model_argument = command.load_model_argument = interrupted
        sys.exit(main(["eval", "--model", "itune-tiny-random", "--data", "x.json", "--output-dir", "out"]))
        """
    )
    (tmp_path / "x.json").write_text('{"images": [{"filename": "a.png", "split": "test", "sentences": [{"raw": "a"}]}]}')
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 130, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == "itune eval: interrupted (Ctrl-C)"
    assert "Traceback" not in result.stderr

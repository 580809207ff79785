"""Output directories (`itune_hf.utils.output_dirs`): a run locks its output directory (a live holder refuses a
second run, a dead one's lock is taken over), files the command did not write are not written over without
`--overwrite`, and a lock on a disk turned read-only is released without an error."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from itune_hf.cli import main

pytestmark = [  # learning runs, subprocesses, kills or benchmarks: only make test-slow runs them
    pytest.mark.slow,
    pytest.mark.usefixtures("fresh_accelerator_state"),  # runs `itune train` in-process
]

TINY = ["--preset", "itune-tiny-random", "--batch-size", "4", "--report-to", "none", "--learning-rate", "1e-2"]
TINY += ["--eval-split", "none", "--mixed-precision", "no"]


def test_an_output_dir_is_locked_by_its_run_and_foreign_files_are_not_written_over(world, tmp_path, capsys):
    import subprocess
    import sys

    from itune_hf.training.checkpoints import LOCK_NAME

    out = tmp_path / "run"
    out.mkdir()
    (out / "README.md").write_text("my notes")
    common = ["train", "--output-dir", str(out), "--data", str(world), *TINY, "--max-steps", "1"]
    capsys.readouterr()
    assert main(common) == 2
    assert "holds files no training run wrote (README.md)" in capsys.readouterr().err
    assert (out / "README.md").read_text() == "my notes"

    (out / "README.md").unlink()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # a live run's process
    try:
        (out / LOCK_NAME).write_text(json.dumps({"pid": other.pid, "host": os.uname().nodename, "started": "x"}))
        assert main(common) == 2
        assert f"in use by a training run (pid {other.pid}" in capsys.readouterr().err
    finally:
        other.kill()
        other.wait()
    assert main(common) == 0  # its process is gone: the stale lock is taken over
    assert f"from a run that is gone (pid {other.pid})" in capsys.readouterr().err
    assert not (out / LOCK_NAME).exists()
    assert main([*common, "--overwrite"]) == 0
    assert "--overwrite: removing 1 checkpoint(s) of the previous run" in capsys.readouterr().err


def test_a_lock_on_a_disk_turned_read_only_is_released_without_an_error(tmp_path, monkeypatch):
    # a disk turning read-only mid-train must not add an atexit traceback (the lock's unlink) to the one error line
    import errno

    from itune_hf.utils.output_dirs import OutputLock

    lock = OutputLock(tmp_path / "run").acquire()

    def read_only(self, missing_ok=False):
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "unlink", read_only)
    lock.release()
    assert not lock.held

"""A lock whose pid now names another process (the holder died; the pid was reused) is taken over, and a lock held
by a live run is refused naming the lock file to delete (`itune_hf.utils.output_dirs.OutputLock`)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from itune_hf.utils.output_dirs import LOCK_NAME, OutputLock, process_start


def write_lock(directory, pid: int, **extra) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    owner = {"pid": pid, "host": socket.gethostname(), "started": "2026-01-01T00:00:00", "what": "a training run"}
    (directory / LOCK_NAME).write_text(json.dumps({**owner, **extra}))


@pytest.fixture
def other_process():
    """A live process that is not an itune command (as a reused pid would be)."""
    process = subprocess.Popen(["sleep", "60"])
    yield process
    process.kill()
    process.wait()


def test_a_reused_pid_does_not_hold_the_lock(tmp_path, other_process, capsys):
    started = process_start(other_process.pid)
    assert started is not None
    write_lock(tmp_path / "a", other_process.pid, process_start=started - 1)  # the holder started before it
    OutputLock(tmp_path / "a").acquire().release()
    assert "its pid now names another process" in capsys.readouterr().err
    write_lock(tmp_path / "b", other_process.pid)  # an older lock without a start time: `sleep` is no itune command
    OutputLock(tmp_path / "b").acquire().release()


def test_a_live_holder_is_refused_naming_the_lock_file(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for _ in range(100):  # its start time is readable once the process exists
            if process_start(holder.pid) is not None:
                break
        write_lock(tmp_path, holder.pid, process_start=process_start(holder.pid))
        with pytest.raises(FileExistsError, match=f"delete the lock file {tmp_path / LOCK_NAME}"):
            OutputLock(tmp_path).acquire()
    finally:
        holder.kill()
        holder.wait()

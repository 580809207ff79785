"""Accelerate's engines, the parts that need no launch: FSDP's layer classes fitted to the model, a lost rank named, an
elastic restart recognised as this launch's own (the launched runs are in test_distributed.py)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from itune_hf import build_model
from itune_hf.training.accelerator import fit_fsdp_wrapping
from itune_hf.training.peers import Peers, record_launch, restarted_launch


@pytest.mark.parametrize(
    "preset, config_names, wrapped",
    [
        ("itune-tiny-random", ["GPT2Block", "CLIPEncoderLayer"], ["GPT2Block", "CLIPEncoderLayer"]),
        ("xgpt-tiny-random", ["GPT2Block", "CLIPEncoderLayer"], ["XGPTLayer"]),  # the old fsdp.yaml's names
        ("itune-tiny-random", None, ["CLIPEncoderLayer", "CLIPVisionEmbeddings", "GPT2Block"]),  # no CLIPText...
    ],
)
def test_fsdp_wraps_the_layer_classes_the_model_has(preset, config_names, wrapped):
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(
        auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=config_names,
        sync_module_states=False, cpu_ram_efficient_loading=False,
    )  # fmt: skip
    said = []
    accelerator = SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin), distributed_type=DistributedType.FSDP,
                                  print=said.append)  # fmt: skip
    model = build_model(preset, pretrained=True)
    assert fit_fsdp_wrapping(accelerator, model) == wrapped
    plugin.set_auto_wrap_policy(model)  # Accelerate's own check: it refuses a class the model lacks
    assert bool(said) == (config_names != wrapped)  # a change of the config's classes is said


def gone_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_lost_peer_is_named_and_any_other_error_keeps_its_traceback(tmp_path):
    host = socket.gethostname()
    peers = Peers([(host, 1), (host, gone_pid()), ("elsewhere", 7)], rank=0)
    reset = RuntimeError("[../gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:41115: Connection reset by peer")
    lost = peers.lost(reset, tmp_path / "step-0000004")
    assert lost is not None and str(lost).startswith(f"rank 1 (pid {peers.ranks[1][1]} on {host}) is gone: rank 0")
    assert "(Read error [127.0.0.1]:41115: Connection reset by peer)" in str(lost)
    assert "step-0000004, is kept" in str(lost)

    alive = Peers([(host, 1), ("elsewhere", 7)], rank=0)
    assert "a rank on another host is gone (one of rank 1 (pid 7 on elsewhere))" in str(alive.lost(reset, None))
    assert alive.lost(RuntimeError("mat1 and mat2 shapes cannot be multiplied"), None) is None  # a bug
    assert Peers([(host, 1)]).lost(reset, None) is None  # one process: nothing to lose
    from itune_hf.training.loop import Interrupted

    stopped = peers.lost(Interrupted(signal.SIGTERM, 3), None)  # the launcher stops the survivors
    assert str(stopped).startswith(f"rank 1 (pid {peers.ranks[1][1]}") and "(the launcher sent SIGTERM)" in str(stopped)
    assert alive.lost(Interrupted(signal.SIGINT, 3), None) is None  # Ctrl-C, every peer alive: an interruption


class SignalledWhileLooking(Peers):
    """Peers whose diagnosis is interrupted by the launcher's SIGTERM (it stops the survivors once it sees a rank
    die, often while this rank is still looking for the dead one: CI saw "interrupted (SIGTERM)" in place of the
    one line naming rank 1)."""

    def gone(self, wait: float = 2.0) -> list[int]:
        signal.raise_signal(signal.SIGTERM)
        return super().gone(wait=0.1)


def test_the_launchers_sigterm_during_the_diagnosis_does_not_replace_it():
    from itune_hf.training.loop import Interrupted

    def stop(signum, frame):
        raise Interrupted(signum)

    host = socket.gethostname()
    reset = RuntimeError("Connection reset by peer")
    previous = signal.signal(signal.SIGTERM, stop)  # what `itune train` installs outside its loop
    try:
        lost = SignalledWhileLooking([(host, 1), (host, gone_pid())], rank=0).lost(reset, None)
        assert str(lost).startswith("rank 1 (pid") and "is gone" in str(lost)
        assert signal.getsignal(signal.SIGTERM) is stop  # the handler is back
        with pytest.raises(Interrupted):  # every peer alive: the signal held meanwhile still stops the run
            SignalledWhileLooking([(host, 1), (host, 1)], rank=0).lost(RuntimeError("a bug"), None)
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_an_elastic_restart_resumes_only_the_run_its_own_launch_started(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    record_launch(tmp_path)  # the first start of the launch
    assert not restarted_launch(tmp_path)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert restarted_launch(tmp_path)
    record_launch(tmp_path)  # a restart does not claim the run again
    monkeypatch.setattr("os.getppid", lambda: 1)  # another launch (another agent), restarted
    assert not restarted_launch(tmp_path)
    assert not restarted_launch(Path(tmp_path / "other"))  # a directory no launch recorded
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT")
    assert not restarted_launch(tmp_path)  # not under a launcher

"""The run's processes as a whole: who each rank is (host, pid), which one is gone when a collective fails
(`PeerLost`: one line naming it instead of a backend traceback), and an elastic restart (`torchrun --max-restarts`,
`accelerate launch --max_restarts`) resuming from the run's last checkpoint (`elastic_restart`)."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

from ..errors import InputError
from .signals import signals_caught

#: What the collective backends say when the process at the other end of a connection is gone (gloo's
#: "Connection reset/closed by peer", NCCL's "remote process exited", a broken pipe): a lost peer, not a bug.
LOST_CONNECTION = ("connection reset", "connection closed", "by peer", "broken pipe", "remote process exited",
                   "connection refused", "socket closed", "nccl communicator was aborted")  # fmt: skip


class PeerLost(InputError):
    """A process of a multi-process run is gone (killed, crashed, its machine down): this one cannot go on.

    Args:
        message: The line printed: which rank is gone, what this rank saw, what is kept and how to go on.
    """


def _first_sentence(error: BaseException) -> str:
    """What the backend said, without its source location (gloo: "[.../pair.cc:537] Read error ...")."""
    import re

    text = re.sub(r"^\[[^\]]*\]\s*", "", str(error).strip()).split(". ")[0].splitlines()
    return text[0][:200] if text and text[0] else type(error).__name__


def elastic_restart() -> int:
    """How many times the launcher (torchrun's elastic agent, under `accelerate launch --max_restarts N` too) has
    restarted this run's processes after a failure (`TORCHELASTIC_RESTART_COUNT`): 0 for a run's first start."""
    try:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    except ValueError:
        return 0


def _process_state(pid: int) -> str | None:
    """The state letter of process `pid` (R, S, Z: a zombie is gone, only not yet reaped), None if there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        try:
            os.kill(pid, 0)  # no /proc (macOS): existence only
        except ProcessLookupError:
            return None
        except OSError:
            return "?"
        return "?"
    return stat.rsplit(")", 1)[1].split()[0]


def join_restarted_group(cpu: bool) -> None:
    """After an elastic restart, start the process group on keys of this restart's own in the launcher's store.

    torchrun's agent keeps one store for every attempt, and the process group's keys are the same in each: the
    restarted processes could read the first attempt's addresses (seen: `Gloo connectFullMesh failed ... timed out
    connecting: SO_ERROR: Connection refused, remote=[127.0.0.1]:26512`, the dead rank's old port, under both the
    static and the c10d rendezvous). Accelerate then finds the group started and keeps it. A first start is left
    to Accelerate.

    Args:
        cpu: The processes run on CPU (gloo); otherwise NCCL where CUDA is.
    """
    import torch
    import torch.distributed as dist

    restart = elastic_restart()
    if restart == 0 or dist.is_initialized() or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return
    from datetime import timedelta

    world_size = int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=False,
                          timeout=timedelta(minutes=30))  # fmt: skip
    backend = "gloo" if cpu or not torch.cuda.is_available() else "nccl"
    prefixed = dist.PrefixStore(f"itune/restart-{restart}/", store)
    dist.init_process_group(backend, store=prefixed, rank=int(os.environ["RANK"]), world_size=world_size)


LAUNCH_MARKER = ".itune-launch.json"  # which launch started the run in an output directory (elastic restarts)


def _launch_identity() -> dict | None:
    """This launch, as its restarts see it too: the host, the launcher's agent (the workers' parent) and the
    rendezvous id; None outside torchrun/`accelerate launch`."""
    if "TORCHELASTIC_RESTART_COUNT" not in os.environ:
        return None
    return {"host": socket.gethostname(), "agent_pid": os.getppid(), "run_id": os.environ.get("TORCHELASTIC_RUN_ID")}


def record_launch(output_dir: Path) -> None:
    """Record which launch started the run in `output_dir` (the main process, once its checks passed), so that an
    elastic restart of the same launch resumes it, and no other launch does (`restarted_launch`)."""
    from ..utils.files import atomic_write_json

    identity = _launch_identity()
    if identity is not None and elastic_restart() == 0:
        atomic_write_json(output_dir / LAUNCH_MARKER, identity)


def restarted_launch(output_dir: Path) -> bool:
    """Whether this process is an elastic restart of the launch that started the run in `output_dir`: then the run
    continues from its newest checkpoint without `--resume` (a restart repeats the command line as first given)."""
    import json

    identity = _launch_identity()
    if identity is None or elastic_restart() == 0:
        return False
    try:
        return json.loads((output_dir / LAUNCH_MARKER).read_text()) == identity
    except (OSError, ValueError):
        return False


class Peers:
    """Every rank's host and pid, gathered once when the run starts (one `all_gather_object`).

    Args:
        ranks: (host, pid) of each rank, by rank.
        rank: This process's rank.
    """

    def __init__(self, ranks: list[tuple[str, int]], rank: int = 0) -> None:
        self.ranks, self.rank, self.host = ranks, rank, socket.gethostname()

    @classmethod
    def gather(cls, accelerator) -> Peers:
        """The run's ranks, from every process (a collective: each process calls it).

        Args:
            accelerator: The run's `Accelerator`.
        """
        me = (socket.gethostname(), os.getpid())
        if accelerator.num_processes == 1:
            return cls([me])
        import torch.distributed

        ranks: list = [None] * accelerator.num_processes
        torch.distributed.all_gather_object(ranks, me)
        return cls([tuple(r) for r in ranks], accelerator.process_index)

    def gone(self, wait: float = 2.0) -> list[int]:
        """The ranks on this host whose process has ended (or is a zombie), looking for up to `wait` seconds (a peer
        that just failed may still be exiting)."""
        deadline = time.monotonic() + wait
        while True:
            dead = [
                rank for rank, (host, pid) in enumerate(self.ranks)
                if rank != self.rank and host == self.host and _process_state(pid) in (None, "Z", "X")
            ]  # fmt: skip
            if dead or time.monotonic() >= deadline:
                return dead
            time.sleep(0.1)

    def elsewhere(self) -> list[int]:
        """The ranks on other hosts (whose processes this one cannot look at)."""
        return [rank for rank, (host, _) in enumerate(self.ranks) if host != self.host]

    def _who_is_gone(self, error: BaseException) -> str | None:
        """Which rank `error` says is gone ("rank 1 (pid ...) is gone"), None when it says no rank is."""
        signalled = isinstance(error, KeyboardInterrupt)
        lost_connection = not signalled and any(words in str(error).lower() for words in LOST_CONNECTION)
        dead = self.gone(wait=2.0 if lost_connection or signalled else 0.5)
        if dead:
            return f"{self.describe(dead)} {'is' if len(dead) == 1 else 'are'} gone"
        if lost_connection and self.elsewhere():
            return f"a rank on another host is gone (one of {self.describe(self.elsewhere())})"
        if lost_connection:
            return "a rank is gone (its process could not be found)"
        return None

    def describe(self, ranks: list[int]) -> str:
        return ", ".join(f"rank {r} (pid {self.ranks[r][1]} on {self.ranks[r][0]})" for r in ranks)

    def lost(self, error: BaseException, checkpoint: Path | None) -> PeerLost | None:
        """The `PeerLost` that `error` means, or None when it is no lost peer: a `RuntimeError` of a collective
        whose peer is gone or whose connection was lost, or a signal (`KeyboardInterrupt`, e.g. the launcher's
        SIGTERM once another process failed) while a peer on this host is gone. Any other error keeps its traceback
        (a bug) and a signal with every peer alive stays an interruption.

        Args:
            error: What this process raised.
            checkpoint: The run's newest checkpoint, or None.
        """
        if len(self.ranks) == 1 or not isinstance(error, (RuntimeError, KeyboardInterrupt)):
            return None
        # SIGINT and SIGTERM are held while the failure is diagnosed (up to 2 s): the launcher's SIGTERM to the
        # survivors often comes then, and raising from a handler there would replace the one line with "interrupted"
        with signals_caught() as held:
            who = self._who_is_gone(error)
        if who is None:
            for signum in held[:1]:  # no peer is gone: a signal that came meanwhile acts now
                signal.raise_signal(signum)
            return None
        seen = f"the launcher sent {error}" if isinstance(error, KeyboardInterrupt) else _first_sentence(error)
        kept = f"the last checkpoint, {checkpoint}, is kept" if checkpoint else "no checkpoint was saved yet"
        return PeerLost(
            f"{who}: rank {self.rank} of {len(self.ranks)} stopped ({seen}); {kept}. Launch the same command with "
            "--resume to continue from it (accelerate launch --max_restarts N restarts from it by itself)"
        )


__all__ = [
    "LAUNCH_MARKER",
    "LOST_CONNECTION",
    "PeerLost",
    "Peers",
    "elastic_restart",
    "join_restarted_group",
    "record_launch",
    "restarted_launch",
]

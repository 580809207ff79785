"""SIGINT and SIGTERM caught for the length of a block: the training loop's stop request (`loop`) and the dead-rank
diagnosis that a launcher's SIGTERM must not cut short (`peers`)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator

CAUGHT = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def signals_caught(on_repeat: Callable[[int], None] | None = None) -> Iterator[list[int]]:
    """Catch SIGINT and SIGTERM inside the block: each one received is appended to the list yielded, and the handlers
    that were there before are put back afterwards. Off the main thread (where handlers cannot be set) nothing is
    installed and the list stays empty.

    Args:
        on_repeat: Called with a signal that arrives after one was already received, instead of appending it (it may
            raise to stop at once); None appends every signal.
    """
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def caught(signum, frame) -> None:
        if received and on_repeat is not None:
            on_repeat(signum)
            return
        received.append(signum)

    previous = {number: signal.signal(number, caught) for number in CAUGHT}
    try:
        yield received
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


__all__ = ["signals_caught"]

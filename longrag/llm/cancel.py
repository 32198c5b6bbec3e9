"""Stopping an in-process generation whose caller has gone (issue 44).

A llama.cpp call runs in a worker thread under the model's lock; cancelling the ``asyncio`` task that
awaits it (a client that disconnected, a request past its deadline: Serve cancels the request's
task and every handle call it made) does not stop the thread. Two pieces do:

* :class:`CancelToken`, one per call: the awaiting side cancels it when its task is cancelled or
  its consumer stops reading; the worker checks it while it waits for the model's lock and before
  it starts, so a request abandoned in the queue never runs;
* :class:`AbortSwitch`, one per llama.cpp context: llama.cpp's abort callback
  (``llama_set_abort_callback``), which its CPU backend calls between the nodes of every graph it
  computes — during prompt evaluation and every decode step. The callback is C, not Python: libc's
  ``strlen`` over a two-byte buffer that holds ``"\\0\\0"`` (0: go on) or ``"x\\0"`` (1: abort). A
  Python callback would take the GIL at every node (~1,000 per decode step for a 0.5B model, each a
  wait when another thread holds it); ``strlen`` reads one byte. Tripping the switch is one store
  from any thread; llama.cpp then stops at the next node and ``llama_decode`` returns 2 (aborted).

The switch is bound to the token of the call that holds the lock (:meth:`AbortSwitch.bound`): a
token cancelled before that is refused at the door, one cancelled during the call trips the switch.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import threading
from collections.abc import Callable, Iterator
from typing import Any

from longrag.llm.base import LLMError

__all__ = ["AbortSwitch", "CancelToken", "LLMCancelled"]


class LLMCancelled(LLMError):
    """The call was cancelled (its caller went away or ran out of time) before or while it ran."""


class CancelToken:
    """One call's cancellation flag, set from any thread; callbacks added with :meth:`on_cancel` run
    once, in the cancelling thread (or at once when the token is already cancelled)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cancelled = False
        self._callbacks: list[Callable[[], None]] = []

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        with self._lock:
            if self._cancelled:
                return
            self._cancelled = True
            callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            cb()

    def on_cancel(self, cb: Callable[[], None]) -> Callable[[], None]:
        """Run ``cb`` when the token is cancelled; returns a function that removes it again."""
        with self._lock:
            if not self._cancelled:
                self._callbacks.append(cb)
                return lambda: self._remove(cb)
        cb()
        return lambda: None

    def _remove(self, cb: Callable[[], None]) -> None:
        with self._lock:
            with contextlib.suppress(ValueError):
                self._callbacks.remove(cb)

    def check(self, what: str = "call") -> None:
        if self._cancelled:
            raise LLMCancelled(f"the {what} was cancelled before it ran")


def _strlen_address() -> int:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
    return ctypes.cast(libc.strlen, ctypes.c_void_p).value or 0


class AbortSwitch:
    """llama.cpp's abort callback for one context (``ctx``: the ``llama_context`` pointer), tripped
    by :meth:`trip` or by the bound token's cancellation (see the module doc)."""

    def __init__(self, ctx: Any) -> None:
        import llama_cpp

        self._flag = ctypes.create_string_buffer(2)  # b"\0\0": strlen 0, go on
        # keep both alive as long as the context: llama.cpp holds their addresses
        self._callback = llama_cpp.ggml_abort_callback(_strlen_address())
        llama_cpp.llama_set_abort_callback(ctx, self._callback, ctypes.cast(self._flag, ctypes.c_void_p))

    @property
    def tripped(self) -> bool:
        return self._flag.raw[0] != 0

    def trip(self) -> None:
        self._flag[0] = b"x"  # strlen 1: abort at llama.cpp's next graph node

    def reset(self) -> None:
        self._flag[0] = b"\0"

    @contextlib.contextmanager
    def bound(self, token: CancelToken | None, what: str = "call") -> Iterator[None]:
        """The switch follows ``token`` for the block (refused at once if it is already cancelled);
        reset before and after, so one call's cancellation never stops the next."""
        self.reset()
        if token is None:
            yield
            return
        token.check(what)
        remove = token.on_cancel(self.trip)
        try:
            yield
        finally:
            remove()
            self.reset()

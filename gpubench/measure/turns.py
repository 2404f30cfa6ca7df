"""Lockstep: two worker processes that take turns, window by window (``gpubench ab --lockstep``).

The machine's speed on a shared VM wanders by 10-20% within seconds, so the same config
measured in two processes a minute apart differs by as much as a real regression. In lockstep
the baseline's and the candidate's workers of one round are alive at once and hand a token to
each other through two pipes: only the holder trains, and it passes the token on after its
cold start and warm-up and after each measured window. The two sides' windows then alternate
a second apart, under the same machine state, and the ratio of the two sides within a round
cancels most of that drift (a paired comparison of the rounds, ``gate.stats.paired_shift``).

The parent passes ``GPUBENCH_TURNS=RFD,WFD,ROLE`` and the two pipe ends: the worker reads the
token from RFD and writes it to WFD. ROLE ``first`` begins; ``second`` first tells the other it
is ready (so that neither trains while the other is still importing its framework). When the
other worker dies, its end of the pipe closes and every wait returns at once: a crash or a
worker of a gpubench without lockstep costs the pairing, never a hang.
"""

from __future__ import annotations

import os
import select
import time

ENV_VAR = "GPUBENCH_TURNS"
ROLES = ("first", "second")
# after taking the token, wait this long before timing: the other's threads (OpenMP workers
# spinning after their last parallel region) are asleep by then
SETTLE_S = 0.05


class Turns:
    """The token-passing of one worker in lockstep (a no-op when not in lockstep)."""

    def __init__(self, rfd: int | None = None, wfd: int | None = None, role: str = "first",
                 timeout_s: float = 600.0) -> None:
        self.rfd, self.wfd, self.role, self.timeout_s = rfd, wfd, role, timeout_s
        self.lockstep = rfd is not None
        self.alone = not self.lockstep  # True once the other worker is gone (or there never was one)
        self.waited_s = 0.0  # seconds spent waiting for the token (the other side training)
        self.lost = False  # the other worker went away before this one's last window

    @classmethod
    def from_env(cls, timeout_s: float = 600.0) -> Turns:
        text = os.environ.pop(ENV_VAR, None)  # not for this worker's children
        if not text:
            return cls()
        r, w, role = text.split(",")
        if role not in ROLES:
            raise ValueError(f"{ENV_VAR}={text}: the role must be one of {', '.join(ROLES)}")
        rfd, wfd = int(r), int(w)
        for fd in (rfd, wfd):  # not for this worker's own children (torchrun, data workers)
            os.set_inheritable(fd, False)
        return cls(rfd, wfd, role, timeout_s)

    def _take(self) -> None:
        if self.alone or self.rfd is None:
            return
        t0 = time.monotonic()
        ready, _, _ = select.select([self.rfd], [], [], self.timeout_s)
        got = os.read(self.rfd, 1) if ready else b""
        self.waited_s += time.monotonic() - t0
        if not got:  # the other worker exited (or hung past the timeout): go on alone
            self.alone = self.lost = True
            return
        time.sleep(SETTLE_S)

    def _give(self) -> None:
        if self.alone or self.wfd is None:
            return
        try:
            os.write(self.wfd, b"t")
        except BrokenPipeError:
            self.alone = self.lost = True

    def begin(self) -> None:
        """Before the cold start: the first worker waits until the second is ready, the second
        says it is ready and waits for its turn."""
        if self.role == "second":
            self._give()
        self._take()

    def swap(self) -> None:
        """Between phases: hand the token over and wait for it to come back."""
        self._give()
        self._take()

    def end(self) -> None:
        """After the last window: hand the token over, and wait until the other has finished its
        last window too, so that this worker's exit does not run beside it."""
        lost = self.lost
        self.swap()
        self.lost = lost  # the other may exit once it has the token back: not a loss
        self.alone = True
        for fd in (self.rfd, self.wfd):
            if fd is not None:
                os.close(fd)
        self.rfd = self.wfd = None

    def describe(self) -> dict[str, object] | None:
        """What a result records of its lockstep (None when the worker ran alone)."""
        if not self.lockstep:
            return None
        return {"role": self.role, "waited_s": round(self.waited_s, 3), "paired": not self.lost}

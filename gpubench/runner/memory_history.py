"""The worker's side of ``gpubench profile --memory-history`` and of an out-of-memory failure:
the device allocator's history recorded from before the model is built, its snapshot written
beside the profile (``memory_snapshot.pickle``, which pytorch.org/memory_viz opens) and
reduced to figures for the result (``gpubench.measure.allocations``).

On rank 0 only (a distributed config's other ranks record nothing). A recording that cannot
start or be written never fails the config: the result says why there is none. The history
costs time on every allocation, so the measured figures of a recorded config are flagged
(``runtime.memory_history``) and are not for comparing with an unrecorded run.
"""

from __future__ import annotations

import contextlib
import pickle
from pathlib import Path
from typing import Any

from gpubench.config import Config
from gpubench.files import write_atomic
from gpubench.measure.allocations import at_oom, history_facts

SNAPSHOT_FILE = "memory_snapshot.pickle"
MAX_ENTRIES = 100_000  # allocator actions kept (each several KB with its stack): the last ones win


class MemoryRecording:
    """``options``: the job's ``memory_history`` (``dir`` absolute, ``rel`` the same relative to
    the run directory, optional ``max_entries``), or None when not asked for."""

    def __init__(self, backend: Any, config: Config, options: dict[str, Any] | None, rank: int) -> None:
        self.backend, self.config, self.options = backend, config, options
        self.recording = self.started = False
        self.reason: str | None = None
        if options is None or rank != 0:
            return
        self.reason = backend.memory_history_problem(config)
        if self.reason is not None:
            return
        try:
            backend.start_memory_history(config, int(options.get("max_entries", MAX_ENTRIES)))
            self.recording = self.started = True
        except Exception as e:  # noqa: BLE001 - a recording that cannot start costs the recording only
            self.reason = f"the allocator history could not start: {type(e).__name__}: {e}"

    @property
    def asked(self) -> bool:
        return self.options is not None

    def _dump(self, snapshot: dict[str, Any]) -> str | None:
        """Write the snapshot; its path relative to the run directory, or None (and the reason
        kept) where it could not be written."""
        assert self.options is not None
        out = Path(self.options["dir"])
        try:
            out.mkdir(parents=True, exist_ok=True)

            def write(tmp: Path) -> None:
                with tmp.open("wb") as f:
                    pickle.dump(snapshot, f)

            write_atomic(out / SNAPSHOT_FILE, write)
        except Exception as e:  # noqa: BLE001 - no room, or a snapshot too large to pickle: the recording only
            self.reason = f"the snapshot could not be written: {type(e).__name__}: {getattr(e, 'strerror', None) or e}"
            return None
        return str(Path(self.options["rel"]) / SNAPSHOT_FILE)

    def _snapshot(self) -> dict[str, Any] | None:
        try:
            snap: dict[str, Any] | None = self.backend.allocator_snapshot(self.config)
            return snap
        except Exception as e:  # noqa: BLE001
            self.reason = f"the allocator snapshot failed: {type(e).__name__}: {e}"
            return None

    def finish(self) -> dict[str, Any] | None:
        """At the end of an ok config: the result's ``profile.memory_history`` block (the
        snapshot's file and figures, or why there is none); None when not asked for."""
        if not self.asked or not self.recording:
            return None if not self.asked or self.reason is None else {"file": None, "reason": self.reason}
        snap = self._snapshot()
        block: dict[str, Any] = {"file": None, "reason": self.reason or "the framework gave no allocator snapshot"}
        if snap is not None:
            try:
                facts = history_facts(snap)
            except Exception as e:  # noqa: BLE001 - an odd snapshot costs its figures, not the config
                facts = {"facts_error": f"{type(e).__name__}: {e}"}
            block = {"file": self._dump(snap), **facts}
            block["reason"] = None if block["file"] else self.reason
        self.stop()
        return block

    def at_failure(self) -> dict[str, Any] | None:
        """After an out-of-memory failure: the allocator then (``metrics.oom``: the request that
        failed, what was free, the totals and the largest live allocations), the snapshot file
        where the history was recorded; None where the framework has no allocator snapshot."""
        snap = self._snapshot()
        if snap is None:
            return None
        try:
            facts = at_oom(snap)
        except Exception as e:  # noqa: BLE001
            facts = {"facts_error": f"{type(e).__name__}: {e}"}
        if self.recording:
            facts["snapshot"] = self._dump(snap)
            self.stop()
        return facts

    def stop(self) -> None:
        if self.recording:
            self.recording = False
            with contextlib.suppress(Exception):  # the snapshot is taken; stopping is tidying up
                self.backend.stop_memory_history(self.config)

    def runtime(self) -> dict[str, Any] | None:
        """``runtime.memory_history``: that this config's figures carry the recording's cost."""
        if not self.asked:
            return None
        return {"recorded": self.started, "reason": self.reason,
                "note": ("every allocation was recorded with its stack: the measured figures include that cost"
                         if self.started else "nothing was recorded")}

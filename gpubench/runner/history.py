"""``gpubench run --db``: the run recorded into the results history as it goes.

The database is opened (connected, its schema checked and migrated) before anything is
written or trained, so an unusable one is one line and exit 2 with nothing started. Each
result is recorded after it is in results.jsonl: the history is a second copy. Should the
database fail during the run, gpubench warns once, stops recording and trains on; the run
directory still has every result (``gpubench history ingest`` adds them later).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpubench.errors import InputError, warn
from gpubench.results.result import Result

if TYPE_CHECKING:
    from gpubench.history.store import Recorder


@dataclass
class LiveRecorder:
    recorder: Recorder
    run_dir_hint: str
    failed: bool = False

    def _guard(self, what: str, fn: Callable[..., object], *args: Any) -> None:
        if self.failed:
            return
        from gpubench.history.db import HistoryError

        try:
            fn(*args)
        except HistoryError as e:
            self.failed = True
            warn(f"{e}; stopped recording {what} into the history: every result is still in the run directory, "
                 f"record it later with: gpubench history ingest {self.run_dir_hint}")

    def record(self, result: Result) -> None:
        self._guard("results", self.recorder.record, result)

    def finish(self, finished_at: str) -> None:
        self._guard("the run's end", self.recorder.finish, finished_at)


class RunHistory:
    """The history a run records into: opened (connected, migrated) when made."""

    def __init__(self, db: str) -> None:
        from gpubench.history.db import open_engine

        self.engine, self.url = open_engine(db)

    def begin(self, meta: dict[str, Any], existing: list[Result], tags: dict[str, str], run_dir: str,
              started: bool = False) -> LiveRecorder:
        """The machine and the run (incomplete) and the results it already has; an error here is
        a HistoryError (exit 2) before any training, or once the run is ``started`` (a Slurm run
        recorded from its first result, whose node's fingerprint is the run's) a warning, as a
        failure during the run is."""
        from gpubench.history.store import Recorder
        from gpubench.results.store import superseded_lines

        try:  # the lines a --retry-failed resume moved out: the history may replace their rows
            superseded = superseded_lines(Path(run_dir))
        except InputError:
            superseded = ()
        live = LiveRecorder(Recorder(self.engine, self.url, meta, tags, source=run_dir, superseded=superseded),
                            run_dir)
        if started:
            live._guard("the run", live.recorder.begin, existing)
        else:
            live.recorder.begin(existing)
        return live


@dataclass
class Recording:
    """A run's results into its history as they come (``history`` None: no history). A run whose
    jobs run on other machines is recorded once its fingerprint is known (its first job's
    node's; ``meta`` is its run.json, which the session fills in), or at its end if no job's
    worker told it; the results before that are recorded with it."""

    history: RunHistory | None
    meta: dict[str, Any]
    earlier: list[Result]
    tags: dict[str, str]
    run_dir: str
    live: LiveRecorder | None = None
    so_far: list[Result] = field(default_factory=list)

    def begin(self, known: bool) -> None:
        """At the start, where the run's fingerprint is ``known`` (a local run's)."""
        if self.history is not None and known:
            self.live = self.history.begin(self.meta, self.earlier, self.tags, self.run_dir)

    def record(self, result: Result) -> None:
        self.so_far.append(result)
        if self.live is not None:
            self.live.record(result)
        elif self.meta.get("env"):
            self.late()

    def late(self) -> None:
        """Begin recording a started run (with its results so far) if it has not begun yet."""
        if self.history is not None and self.live is None and (self.earlier or self.so_far):
            self.live = self.history.begin(self.meta, self.earlier + self.so_far, self.tags, self.run_dir,
                                           started=True)

    def finish(self) -> None:
        if self.live is not None:
            self.live.finish(self.meta["finished_at"])

"""``gpubench find-batch``: the largest batch per config of a suite, as a session of probes.

Each probe is a job of a run directory (``<suite>-find-batch-...``: every probe's result, its
log and memory), run where the launcher runs jobs: a worker process here, or a Slurm job on a
node of the partition it searches for (``--launcher slurm``)."""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console
from rich.table import Table

from gpubench.errors import EXIT_FAILED, EXIT_OK, InputError, stop_exit_code, stop_message
from gpubench.launch import Interpreter
from gpubench.results.outputs import check_output_file, write_output
from gpubench.results.result import Outcome
from gpubench.results.store import json_text
from gpubench.runner.find_batch import Search, find_max_batch
from gpubench.runner.job import Job
from gpubench.runner.launcher import LauncherChoice
from gpubench.runner.local import Local
from gpubench.runner.models import user_code_path
from gpubench.runner.session import Session, load
from gpubench.suite import MAX_BATCH, Config

DEFAULT_LIMIT = 1 << 20


@dataclass
class FindBatchRequest:
    suite: str
    sets: list[str] = field(default_factory=list)
    limit: int = DEFAULT_LIMIT
    json: Path | None = None
    out: Path = Path("runs")
    launcher: LauncherChoice | None = None  # --launcher and its options (None: this machine)


def _starts(configs: list[Config]) -> list[Config]:
    """One search per config apart from its batch size, from its smallest."""
    starts: dict[str, Config] = {}
    for c in configs:
        if c.batch_size == MAX_BATCH:
            c = replace(c, batch_size=c.max_batch_start)
        key = replace(c, batch_size=1).config_id
        if key not in starts or c.batch < starts[key].batch:
            starts[key] = c
    return list(starts.values())


def _probe(session: Session, config: Config) -> Outcome:
    """One probe: a job of the session's run directory, where its launcher runs jobs."""
    session.console.print(f"  probe batch {config.batch_size}", highlight=False)
    return session.one(Job(config, 0))


def run_find_batch(req: FindBatchRequest, console: Console) -> int:
    suite = load(req.suite, req.sets)  # InputError -> exit 2 in the CLI
    check_output_file(req.json, "--json")
    starts = _starts(suite.expand())
    too_big = [c for c in starts if c.batch > req.limit]
    if too_big:
        raise InputError(f"--limit {req.limit}: below the batch the search starts from ({too_big[0].batch_size}, "
                         f"{too_big[0].config_id}); give a larger --limit or a smaller batch_size")
    session = Session(console, req.launcher or Local(), Interpreter(code_path=user_code_path(starts, suite.source)))
    session.check(starts, suite.source, req.out)
    session.probe(starts, suite.source)
    searches: list[Search] = []
    with ExitStack() as held:
        session.open(held, req.out, f"{suite.name}-find-batch-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}", suite,
                     {"suite": req.suite, "set": req.sets, "repeats": 1, "out": str(req.out),
                      "find_batch_limit": req.limit}, starts)
        try:
            for config in starts:
                console.print(f"searching {config.config_id} from batch {config.batch_size} (limit {req.limit})",
                              highlight=False)
                s = find_max_batch(config, req.limit, lambda c: _probe(session, c))
                searches.append(s)
                console.print(f"  max batch {s.max_batch or '-'}, first oom {s.first_oom or '-'}"
                              + (f"; stopped: {s.stopped}" if s.stopped else ""), highlight=False)
                if req.json is not None:  # after every search: a command stopped midway keeps those done
                    write_output(req.json, json_text([x.to_dict() for x in searches]), "--json")
        except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (errors.Stopped)
            done = f"{len(searches)} finished search(es) in {req.json}, " if req.json is not None and searches else ""
            stop_message(e, f"{done}every probe that finished in {session.run_dir / 'results.jsonl'}; a search is "
                            "not resumed: run the same find-batch again to search anew")
            return stop_exit_code(e)
        session.finish()
    table = Table(title="largest batch that fits")
    for col in ("config (where the search started)", "max batch", "first oom", "probes", "note"):
        table.add_column(col, no_wrap=col.startswith("config"))
    for s in searches:
        note = s.stopped or ("" if s.first_oom is not None else f"fits up to the limit {req.limit}")
        table.add_row(s.config_id, str(s.max_batch or "-"), str(s.first_oom or "-"), str(len(s.probes)), note)
    console.print(table)
    console.print(f"probes: {session.run_dir / 'results.jsonl'}", highlight=False)
    return EXIT_FAILED if any(s.stopped for s in searches) else EXIT_OK

"""``gpubench find-batch``: the largest batch per config of a suite."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from gpubench.errors import InputError
from gpubench.launch import Launcher
from gpubench.results.outputs import check_output_file, write_output
from gpubench.results.store import json_text
from gpubench.runner.find_batch import find_max_batch
from gpubench.runner.models import check_models, user_code_path
from gpubench.suite import MAX_BATCH, Config, load_suite


def run_find_batch(suite_name: str, sets: list[str], limit: int, json_path: Path | None, console: Console) -> int:
    suite = load_suite(suite_name).with_overrides(sets)  # InputError -> exit 2 in the CLI
    check_output_file(json_path, "--json")
    starts: dict[str, Config] = {}
    for c in suite.expand():  # one search per config apart from its batch size, from its smallest
        if c.batch_size == MAX_BATCH:
            c = replace(c, batch_size=c.max_batch_start)
        key = replace(c, batch_size=1).config_id
        if key not in starts or c.batch < starts[key].batch:
            starts[key] = c
    too_big = [c for c in starts.values() if c.batch > limit]
    if too_big:
        raise InputError(f"--limit {limit}: below the batch the search starts from ({too_big[0].batch_size}, "
                         f"{too_big[0].config_id}); give a larger --limit or a smaller batch_size")
    launcher = Launcher(code_path=user_code_path(list(starts.values()), suite.source))
    check_models(list(starts.values()), suite.source, launcher, skip_frameworks=set())
    searches = []
    for config in starts.values():
        console.print(f"searching {config.config_id} from batch {config.batch_size} (limit {limit})",
                      highlight=False)
        s = find_max_batch(config, limit, launcher, on_probe=lambda c: console.print(f"  probe batch {c.batch_size}",
                                                                          highlight=False))
        searches.append(s)
        console.print(f"  max batch {s.max_batch or '-'}, first oom {s.first_oom or '-'}"
                      + (f"; stopped: {s.stopped}" if s.stopped else ""), highlight=False)
        if json_path is not None:  # after every search: a command stopped midway keeps those done
            write_output(json_path, json_text([x.to_dict() for x in searches]), "--json")
    table = Table(title="largest batch that fits")
    for col in ("config (where the search started)", "max batch", "first oom", "probes", "note"):
        table.add_column(col, no_wrap=col.startswith("config"))
    for s in searches:
        note = s.stopped or ("" if s.first_oom is not None else f"fits up to the limit {limit}")
        table.add_row(s.config_id, str(s.max_batch or "-"), str(s.first_oom or "-"), str(len(s.probes)), note)
    console.print(table)
    return 1 if any(s.stopped for s in searches) else 0

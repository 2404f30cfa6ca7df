"""``gpubench list`` and ``gpubench env``: what this installation and machine offer."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gpubench.backends import BACKENDS
from gpubench.env import fingerprint
from gpubench.errors import InputError
from gpubench.runner.probe import probe
from gpubench.suite import load_suite
from gpubench.workloads import WORKLOADS

DEFAULT_SUITES = Path("suites")


def probe_all() -> dict[str, dict[str, Any]]:
    names = sorted(BACKENDS)
    with ThreadPoolExecutor(len(names)) as pool:
        return {name: p.to_dict() for name, p in zip(names, pool.map(probe, names))}


def show_list(console: Console, suites_dir: Path | None) -> None:
    """``suites_dir`` None: ``suites/`` here, if there is one (list works anywhere); a directory
    the user names must exist."""
    if suites_dir is not None and not suites_dir.is_dir():
        raise InputError(f"--suites-dir {suites_dir}: "
                         + ("not a directory" if suites_dir.exists() else "no such directory"))
    suites_dir = suites_dir or DEFAULT_SUITES
    suites = Table("suite", "configs", "description", title=f"suites ({suites_dir})")
    for path in sorted(suites_dir.glob("*.toml")):
        try:
            s = load_suite(str(path))
            suites.add_row(path.stem, str(len(s.expand())), s.description)
        except InputError as e:
            suites.add_row(path.stem, "[red]invalid[/red]", str(e))
    console.print(suites)

    workloads = Table("workload", "parameters (default)", "params", "train FLOPs/sample", "description",
                      title="workloads")
    for name, w in sorted(WORKLOADS.items()):
        spec = w.spec()
        params = ", ".join(f"{p.name}={p.default}" for p in w.params) or "-"
        workloads.add_row(name, params, f"{spec.params:,}", f"{spec.train_flops_per_sample:,}", w.description)
    console.print(workloads)

    frameworks = Table("framework", "version", "devices", "note", title="frameworks and devices (detected here)")
    with console.status("probing frameworks..."):
        probes = probe_all()
    for name, p in probes.items():
        devices = ", ".join(f"{d['name']} ({d['model']})" for d in p["devices"]) or "-"
        frameworks.add_row(name, p["version"] or "-", devices, p["reason"] or "")
    console.print(frameworks)


def show_env(console: Console, as_json: bool) -> None:
    with console.status("probing frameworks..."):
        env = fingerprint(probe_all())
    if as_json:
        print(json.dumps(env, indent=2))
        return
    table = Table(title="environment fingerprint", show_header=False)
    table.add_column("key")
    table.add_column("value", overflow="fold")
    for key, value in env.items():
        if key == "frameworks":
            for name, p in value.items():
                table.add_row(f"framework {name}", f"{p['version']}  {json.dumps(p['build'])}" if p["available"]
                              else f"unavailable: {p['reason']}")
        else:
            table.add_row(key, value if isinstance(value, str) else json.dumps(value))
    console.print(table)

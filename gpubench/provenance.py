"""Where a run's figures come from: the commit, branch and commit time of the code under
test, and the CI job that ran it. Stored in run.json and, with ``--db``, in the history.

The code under test is the repository the run was started in: a CI system's own variables
name its commit first (GitHub Actions, GitLab CI, Buildkite, Jenkins), then ``git`` in the
working directory, then gpubench's own checkout (when gpubench is benchmarked itself).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpubench.errors import InputError

# (commit, branch, job link) per CI system, by its documented variables; a branch variable
# listed first wins (a pull request's source branch before the merge ref)
_CI: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("GITHUB_SHA", ("GITHUB_HEAD_REF", "GITHUB_REF_NAME"), ()),
    ("CI_COMMIT_SHA", ("CI_COMMIT_REF_NAME",), ("CI_JOB_URL",)),
    ("BUILDKITE_COMMIT", ("BUILDKITE_BRANCH",), ("BUILDKITE_BUILD_URL",)),
    ("GIT_COMMIT", ("GIT_BRANCH",), ("BUILD_URL",)),
)


def _git(where: Path, *args: str) -> str | None:
    try:
        proc = subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def ci_url(environ: Mapping[str, str]) -> str | None:
    """The link to the CI job or workflow run, where the usual variables say it."""
    if environ.get("GITHUB_RUN_ID") and environ.get("GITHUB_REPOSITORY"):
        server = environ.get("GITHUB_SERVER_URL", "https://github.com")
        return f"{server}/{environ['GITHUB_REPOSITORY']}/actions/runs/{environ['GITHUB_RUN_ID']}"
    return next((environ[name] for _, _, links in _CI for name in links if environ.get(name)), None)


def provenance(cwd: Path | None = None, environ: Mapping[str, str] | None = None,
               fallback: Path | None = None) -> dict[str, Any]:
    """``commit``, ``branch``, ``commit_time`` (ISO 8601, the committer's), ``ci_url`` and
    ``source`` (``ci``, ``git``, ``gpubench`` or None when nothing said), each None when
    unknown. ``fallback``: the repository to ask last (default: gpubench's own checkout)."""
    environ = os.environ if environ is None else environ
    cwd = Path.cwd() if cwd is None else cwd
    commit = branch = source = None
    for commit_var, branch_vars, _ in _CI:
        if environ.get(commit_var):
            commit, source = environ[commit_var], "ci"
            branch = next((environ[v] for v in branch_vars if environ.get(v)), None)
            break
    where = cwd
    if commit is None:
        for where, label in ((cwd, "git"), (fallback or Path(__file__).resolve().parent.parent, "gpubench")):
            if (commit := _git(where, "rev-parse", "HEAD")) is not None:
                source = label
                break
    if commit is not None and branch is None and source != "ci":
        name = _git(where, "rev-parse", "--abbrev-ref", "HEAD")
        branch = name if name != "HEAD" else None  # a detached head has no branch
    commit_time = _git(where, "show", "-s", "--format=%cI", commit) if commit else None
    return {"commit": commit, "branch": branch, "commit_time": commit_time, "ci_url": ci_url(environ),
            "source": source}


def commit_time(commit: str, where: Path | None = None) -> str | None:
    """The committer's time of ``commit`` in the repository at ``where`` (default: gpubench's
    own checkout), or None where git does not know it."""
    return _git(where or Path(__file__).resolve().parent.parent, "show", "-s", "--format=%cI", commit)


def parse_tags(items: list[str], flag: str = "--tag") -> dict[str, str]:
    """``--tag key=value`` items as a dict; a malformed one is an InputError naming it."""
    tags: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InputError(f"{flag} {item!r}: expected KEY=VALUE, e.g. {flag} runner=h100-a")
        tags[key.strip()] = value.strip()
    return tags

"""The git side of ``gpubench bisect``: revisions checked, the commits between them, a worktree
per commit (kept in a cache and reused), an environment per worktree where asked, and what is
shown of the culprit."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from gpubench.errors import InputError
from gpubench.launch import Interpreter

# what decides a worktree's environment (--setup): the same files, the same environment
DEPENDENCY_FILES = ("pyproject.toml", "setup.py", "setup.cfg", "requirements.txt", "requirements-dev.txt",
                    "environment.yml", "uv.lock", "poetry.lock")


def git(repo: Path, *args: str, check: bool = True) -> str:
    """git's output (stripped); InputError with git's own line when it fails and ``check``."""
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if proc.returncode != 0 and check:
        line = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise InputError(f"git {' '.join(args)}: {line}")
    return proc.stdout.strip()


def toplevel(repo: Path, option: str = "--repo") -> Path:
    top = git(repo, "rev-parse", "--show-toplevel", check=False)  # nothing on stdout where it fails
    if not top:
        raise InputError(f"{option} {repo}: not a git repository")
    return Path(top)


def resolve(repo: Path, rev: str, option: str) -> str:
    sha = git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", check=False)
    if not sha:
        raise InputError(f"{option} {rev}: not a commit of {repo}")
    return sha


def commits_between(repo: Path, good: str, bad: str) -> list[str]:
    """The commits after ``good`` up to ``bad`` on the path between them, oldest first;
    InputError unless ``good`` is an ancestor of ``bad`` (and not ``bad`` itself)."""
    if good == bad:
        raise InputError(f"--good and --bad are the same commit ({good[:12]}): nothing to bisect")
    if subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", good, bad]).returncode != 0:
        raise InputError(f"--good {good[:12]} is not an ancestor of --bad {bad[:12]}: bisect needs the good "
                         "revision before the bad one in history")
    out = git(repo, "rev-list", "--reverse", "--ancestry-path", "--first-parent", f"{good}..{bad}")
    return out.split() or [bad]


def has_file(repo: Path, sha: str, path: str) -> bool:
    """Whether ``path`` exists in the commit ``sha``."""
    return subprocess.run(["git", "-C", str(repo), "cat-file", "-e", f"{sha}:{path}"],
                          capture_output=True).returncode == 0


def worktree(repo: Path, sha: str, cache: Path) -> Path:
    """A detached worktree of ``sha`` in ``cache`` (made once, then reused)."""
    path = cache / sha[:16]
    if (path / ".git").exists() and git(path, "rev-parse", "HEAD", check=False) == sha:
        return path
    cache.mkdir(parents=True, exist_ok=True)
    if path.exists():  # a worktree left half-made: git's own record of it goes first
        git(repo, "worktree", "remove", "--force", str(path), check=False)
    git(repo, "worktree", "prune")
    git(repo, "worktree", "add", "--detach", "--force", str(path), sha)
    return path


def dependency_key(tree: Path) -> str:
    """A hash of a worktree's dependency files (DEPENDENCY_FILES): worktrees with the same key
    share one environment."""
    h = hashlib.sha1()
    for name in DEPENDENCY_FILES:
        p = tree / name
        h.update(name.encode() + b"\0" + (p.read_bytes() if p.is_file() else b"-") + b"\0")
    return h.hexdigest()[:16]


def environment(tree: Path, setup: str, cache: Path, log: Path) -> str:
    """The Python of the worktree's environment (--setup): a virtual environment per dependency
    key, made once with the system's packages visible, then ``setup`` run in the worktree with
    it first on PATH. Returns its interpreter."""
    env_dir = cache / "envs" / dependency_key(tree)
    python = env_dir / "bin" / "python"
    ready = env_dir / ".gpubench-ready"
    if ready.is_file():
        return str(python)
    env_dir.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as out:
        made = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(env_dir)], stdout=out,
                              stderr=subprocess.STDOUT)
        if made.returncode != 0:
            raise InputError(f"python -m venv {env_dir} failed (log: {log})")
        env = {**os.environ, "PATH": f"{env_dir / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
               "VIRTUAL_ENV": str(env_dir)}
        ran = subprocess.run(setup, shell=True, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT)
    if ran.returncode != 0:
        raise InputError(f"--setup {setup!r} failed in {tree} with exit {ran.returncode} (log: {log}); fix the "
                         "command, or bisect a range whose commits it sets up")
    ready.write_text(setup + "\n")
    return str(python)


def checkout(repo: Path, sha: str, cache: Path, setup: str, log: Path) -> Interpreter:
    """How a side runs ``sha``: its worktree (cached) first on the path, with the Python of its
    ``setup`` environment, or this one where there is no setup."""
    tree = worktree(repo, sha, cache)
    return Interpreter(python=environment(tree, setup, cache, log) if setup else sys.executable, pythonpath=str(tree))


def describe(repo: Path, sha: str) -> dict[str, str]:
    """The culprit as the output shows it: subject, author, date and diff stat."""
    subject, author, date = (git(repo, "show", "-s", f"--format={f}", sha) for f in ("%s", "%an <%ae>", "%cI"))
    return {"commit": sha, "subject": subject, "author": author, "date": date,
            "diffstat": git(repo, "show", "--stat", "--format=", sha)}

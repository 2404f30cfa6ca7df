from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

try:  # before any test imports TensorFlow: a CUDA build of torch brings Triton, whose import
    # crashes the process (SIGSEGV) once TensorFlow's libraries are loaded, not the other way round
    import triton  # noqa: F401
except ImportError:
    pass

REPO = Path(__file__).resolve().parent.parent


def requires(*packages: str) -> None:
    """Skip the test where a package is not installed, without importing it here (importorskip
    would: seconds for a framework, and an import of torchvision that gpubench's own loader makes
    work where its compiled operators do not load beside this torch)."""
    import importlib.util

    missing = [p for p in packages if importlib.util.find_spec(p) is None]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)}")


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's loadgroup reads the groups
def pytest_collection_modifyitems(config, items):
    # the tests of a module that share a module-scoped fixture (one run, one server, one Slurm
    # cluster: seconds to minutes each) run on one pytest-xdist worker (-n 2 --dist loadgroup),
    # so that the fixture is made once, not once per worker
    for item in items:
        defs = getattr(item, "_fixtureinfo", None)
        shared = defs is not None and any(d.scope == "module" for name in item.fixturenames
                                           for d in defs.name2fixturedefs.get(name, ()))
        if shared and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU here")
    for item in items:
        if item.get_closest_marker("gpu") is not None:  # the marker, not a test id that says "gpu"
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def _calibration_cache(tmp_path_factory):
    """Every gpubench the tests start caches device peaks in one fresh directory of the test
    session (calibrated once, by the first run that needs it), never in the user's cache; under
    pytest-xdist, one directory for all the session's workers (their common temporary root).
    GPUBENCH_TEST_CACHE_DIR names another (.ci/run: one for its two test sessions, so that the
    slow tests do not calibrate the machine the default tests calibrated)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    cache = Path(os.environ.get("GPUBENCH_TEST_CACHE_DIR") or root / "gpubench-cache")
    cache.mkdir(parents=True, exist_ok=True)
    os.environ["GPUBENCH_CACHE_DIR"] = str(cache)


def plugin_env(**extra: str) -> dict[str, str]:
    """Environment for a gpubench subprocess that loads the fake test backend."""
    # not pytest-xdist's worker variables: a pytest started by a test is a session of its own
    # (pytest-benchmark would disable itself there, as it does in xdist's workers)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST_", "PYTEST_CURRENT_TEST"))}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["GPUBENCH_PLUGINS"] = "tests.plugins.fake"
    env.update(extra)
    return env


def plain_env(**extra: str) -> dict[str, str]:
    """Environment for a gpubench subprocess with the real backends only (the repository on
    PYTHONPATH as an absolute path: a relative one, e.g. gpu_check.sh's, would not survive
    the subprocess's own working directory)."""
    env = plugin_env(**extra)
    env.pop("GPUBENCH_PLUGINS")
    return env


def run_cli(args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 300
            ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpubench", *args], cwd=cwd, env=env or plugin_env(),
                          capture_output=True, text=True, timeout=timeout)


def fake_suite(name: str, timeout_s: int = 20, matrix: str = "") -> str:
    """A suite of the fake test backend's ``fault`` workload (tests/plugins/fake.py), small and
    fast, with ``matrix`` (TOML lines) as its [matrix] table."""
    text = f"""
name = "{name}"
[defaults]
framework = "fake"
workload = "fault"
batch_size = 8
warmup_steps = 1
steps = 3
windows = 2
timeout_s = {timeout_s}
"""
    return text + (f"[matrix]\n{matrix}\n" if matrix else "")


@pytest.fixture
def write_suite(tmp_path):
    def write(text: str, name: str = "s.toml") -> Path:
        p = tmp_path / name
        p.write_text(text)
        return p
    return write


def result_lines(run_dir: Path) -> list[dict]:
    """A run directory's results.jsonl as JSON objects, each read (and shape-checked) as gpubench
    reads it: what the file holds, for tests of its format."""
    from gpubench.results.store import load_results

    return [r.to_json() for r in load_results(Path(run_dir))]


def make_result(config, rate: float = 100.0, status: str = "ok", repeat: int = 0, run_id: str = "r",
                memory: dict | None = None, **metrics):
    """A Result of ``config`` as a run records it (an ok one with the figures an ok line must
    carry, at ``rate`` samples/s), for tests of what reads results."""
    from gpubench.results.result import Result

    spp = config.samples_per_step if isinstance(config.batch_size, int) else 1
    figures = {"throughput": {"median": rate, "ci_low": rate, "ci_high": rate},
               "step_time_ms": {"median": spp * 1000.0 / rate, "cv": 0.0}, "cold_start_ms": 1.0,
               "samples_per_step": spp, "devices": config.devices} if status == "ok" else {}
    return Result(run_id=run_id, config_id=config.config_id, config_hash=config.config_hash, repeat=repeat,
                  config=config.to_dict(), status=status, reason="" if status == "ok" else status,
                  metrics={**figures, "memory": memory or {}, **metrics})


def parallel_twins(run_dir: Path) -> list[dict]:
    """The report's parallel-over-single comparisons of a run (twins.speedups), one dict each."""
    from gpubench.results.frame import aggregate, results_frame
    from gpubench.results.store import load_results
    from gpubench.results.twins import COMPARISONS, speedups

    parallel = next(c for c in COMPARISONS if c.axis == "parallelism")
    return speedups(aggregate(results_frame(load_results(Path(run_dir)))), parallel).to_dict("records")


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL server of the test session (tests/postgres.py)."""
    from tests.postgres import postgres_server

    yield from postgres_server()


@pytest.fixture(params=["sqlite", "postgresql"])
def history_db(request, tmp_path):
    """A fresh, empty results-history database: a SQLite file, and a database of its own on the
    session's PostgreSQL server; every history test runs against both."""
    if request.param == "sqlite":
        return str(tmp_path / "history.db")
    server = request.getfixturevalue("postgres")
    name = f"h_{abs(hash(request.node.nodeid)) % 10**12}_{len(os.listdir(tmp_path))}"
    return server.create_database(name)

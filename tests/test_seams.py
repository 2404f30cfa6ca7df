"""Frameworks are named only in their own packages: outside ``gpubench/backends/``, no code
compares with, branches on or maps a framework's registry name (help texts and docstrings may
describe what each framework does)."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

from gpubench.backends import BACKENDS, REFERENCE_FRAMEWORK
from gpubench.config import DEFAULTS, Config
from gpubench.options import Capabilities, RankStart

PACKAGE = Path(__file__).resolve().parent.parent / "gpubench"
# the one literal outside backends/: a Config's default framework (config.py sits below the
# backends' layer, so it cannot read backends.REFERENCE_FRAMEWORK); it must be that framework
ALLOWED = {("config.py", "framework")}


def literals_in(text: str, rel: str) -> list[str]:
    """The string constants in ``text`` (the module ``rel``) that equal a registered
    framework's name, as ``rel:line: 'name'``, other than the allowed default."""
    tree = ast.parse(text)
    allowed = {id(inner) for node in ast.walk(tree)
               if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
               and (rel, node.target.id) in ALLOWED and node.value is not None
               for inner in ast.walk(node.value)}  # its default, also inside setting("torch", ...)
    return [f"{rel}:{node.lineno}: {node.value!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and node.value in BACKENDS and id(node) not in allowed]


def framework_literals() -> list[str]:
    """Every such constant in gpubench outside backends/."""
    return [hit for path in sorted(PACKAGE.rglob("*.py")) if path.relative_to(PACKAGE).parts[0] != "backends"
            for hit in literals_in(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE)))]


def test_the_detector_finds_a_framework_named_in_code():
    assert literals_in('if config.framework == "tensorflow":\n    pass\n', "x.py") == ["x.py:1: 'tensorflow'"]
    assert literals_in('framework: str = "torch"\n', "config.py") == []
    assert literals_in('framework: str = setting("torch", help="")\n', "config.py") == []
    assert literals_in('framework: str = "torch"\n', "suite.py") == ["suite.py:1: 'torch'"]
    assert literals_in('"""torch, tensorflow and jax"""\n', "x.py") == []  # prose is not a name


def test_no_framework_is_named_outside_its_package():
    assert framework_literals() == []


def test_a_configs_default_framework_is_the_reference_one():
    assert DEFAULTS["framework"] == REFERENCE_FRAMEWORK


def test_every_suite_key_is_one_declaration():
    """A setting is a field of Config declared with gpubench.config.setting: the suite's checks
    and help, the id and hash rules, the frame's and CSV's columns and the settings a backend
    declares support for are all read from those declarations."""
    from gpubench.config import BACKEND_CHECKED, COLUMNS, SETTING_FIELDS, SUITE_KEYS
    from gpubench.docgen import suite_keys_reference
    from gpubench.report.build import IDENTITY_CSV_COLUMNS
    from gpubench.results.frame import CONFIG_COLUMNS
    from gpubench.settings import SETTINGS

    assert list(SETTINGS) == list(SUITE_KEYS) and "nnodes" not in SETTINGS  # a run's, not a suite's
    assert all(f.metadata["help"] for f in SETTING_FIELDS)
    assert CONFIG_COLUMNS == list(COLUMNS) and set(COLUMNS) <= set(IDENTITY_CSV_COLUMNS)
    assert {"beta2", "weight_decay", "momentum"} <= set(COLUMNS)  # the last settings added, by declaration alone
    assert BACKEND_CHECKED == ("precision", "parallelism", "optimizer", "loss", "compile", "memory_format", "data",
                               "dataset", "attention", "optimizer_impl", "checkpointing")
    page = suite_keys_reference()
    assert all(f"| `{key}` |" in page for key in SUITE_KEYS)


class _Declared:
    """A backend's declarations as the registry returns them (tests below register it)."""

    capabilities = Capabilities(precisions={"cpu": ("fp32",)}, parallelism=("single", "ddp", "multiworker"),
                                rank_start={"ddp": RankStart(node_module="my_node_launcher")})


def test_a_distributed_kinds_processes_start_as_its_backend_declares(tmp_path, monkeypatch):
    """The runner starts a distributed config's ranks as its backend declares (RankStart): its
    node launcher with torchrun's flags, or each rank a process of gpubench.runner.ranks; here
    and under Slurm alike."""
    from gpubench.launch import Interpreter
    from gpubench.runner.job import Job
    from gpubench.runner.nodes import Nodes
    from gpubench.runner.process import worker_command
    from gpubench.runner.slurm import SlurmOptions, batch_script

    monkeypatch.setitem(BACKENDS, "declared", "tests.test_seams:_Declared")
    node = Config(workload="mlp", framework="declared", parallelism="ddp:2")
    rank = Config(workload="mlp", framework="declared", parallelism="multiworker:2")
    command = worker_command(Interpreter(), tmp_path, node)
    assert command[command.index("-m") + 1:] == ["my_node_launcher", "--standalone", "--nnodes=1",
                                                 "--nproc-per-node=2", "-m", "gpubench.runner.worker", str(tmp_path)]
    two = Nodes(nnodes=2, node_rank=1, master_addr="node0", master_port=29600)
    assert worker_command(Interpreter(), tmp_path, node, two)[-8:-4] == [
        "--nnodes=2", "--node-rank=1", "--master-addr=node0", "--master-port=29600"]
    command = worker_command(Interpreter(), tmp_path, rank, two)
    assert command[command.index("-m") + 1:] == ["gpubench.runner.ranks", "--nproc-per-node=2", "--nnodes=2",
                                                 "--node-rank=1", "--master-addr=node0", "--master-port=29600",
                                                 str(tmp_path)]

    def script(config: Config) -> str:
        return batch_script(Job(config, 0), tmp_path / "w", tmp_path / "l.log", Interpreter(), SlurmOptions())

    across = script(replace(node, nnodes=2))
    assert "#SBATCH --ntasks-per-node=1" in across and "#SBATCH --cpus-per-task=2" in across
    assert "my_node_launcher --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d" in across
    per_rank = script(replace(rank, nnodes=2))
    assert "#SBATCH --ntasks-per-node=2" in per_rank and "export GPUBENCH_RANKS=slurm" in per_rank
    assert "my_node_launcher" not in per_rank and "gpubench.runner.ranks" not in per_rank


def test_no_node_launcher_is_named_outside_its_backend():
    """The modules that start a framework's ranks are named by its backend's declaration only."""
    from gpubench.backends.registry import load_class

    modules = {start.node_module for name in BACKENDS for start in load_class(name).capabilities.rank_start.values()
               if start.node_module}
    assert modules  # PyTorch declares torchrun
    hits = [f"{path.relative_to(PACKAGE)}:{node.lineno}" for path in sorted(PACKAGE.rglob("*.py"))
            if path.relative_to(PACKAGE).parts[0] != "backends"
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Constant) and node.value in modules]
    assert hits == []

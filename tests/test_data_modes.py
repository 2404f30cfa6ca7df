"""Input-pipeline mode, the MNIST IDX reader, and pipeline-vs-device comparisons."""

from __future__ import annotations

import gzip
import shutil
from dataclasses import replace

import numpy as np
import psutil
import pytest

from gpubench.results.frame import aggregate, results_frame
from gpubench.results.store import load_results
from gpubench.results.twins import COMPARISONS, speedups
from gpubench.suite import Config
from gpubench.workloads import get_workload
from gpubench.workloads.mnist import IMAGES, LABELS, TEST_IMAGES, TEST_LABELS, IdxError, load_mnist, read_idx, write_idx
from tests.conftest import make_result, result_lines, run_cli


def tiny_mnist(directory, n=64, gz=False, seed=0):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n, dtype=np.uint8)
    suffix = ".gz" if gz else ""
    directory.mkdir(parents=True, exist_ok=True)
    write_idx(directory / f"{IMAGES}{suffix}", images)
    write_idx(directory / f"{LABELS}{suffix}", labels)
    return images, labels


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_idx_round_trip(tmp_path, gz):
    images, labels = tiny_mnist(tmp_path, gz=gz)
    x, y = load_mnist(tmp_path)
    assert x.shape == (64, 1, 28, 28) and x.dtype == np.float32
    np.testing.assert_allclose(x[:, 0], (images / 255.0 - 0.1307) / 0.3081, rtol=1e-6)
    assert np.array_equal(y, labels) and y.dtype == np.int64


def test_mnist_errors_name_the_file(tmp_path):
    with pytest.raises(IdxError, match=f"no {IMAGES}"):
        load_mnist(tmp_path)
    tiny_mnist(tmp_path)
    (tmp_path / IMAGES).write_bytes(b"\x00\x00\x08\x03" + (5).to_bytes(4, "big") + (28).to_bytes(4, "big") * 2 + b"x" * 10)
    with pytest.raises(IdxError, match=r"header says \(5, 28, 28\) \(3920 bytes of data\) but 10 bytes follow"):
        load_mnist(tmp_path)
    (tmp_path / IMAGES).write_bytes(b"PK\x03\x04 not idx at all")
    with pytest.raises(IdxError, match=f"{IMAGES}: not an unsigned-byte IDX file with 3 dimension"):
        load_mnist(tmp_path)
    (tmp_path / IMAGES).unlink()
    (tmp_path / f"{IMAGES}.gz").write_bytes(b"not gzip")
    with pytest.raises(IdxError, match="cannot read"):
        load_mnist(tmp_path)
    (tmp_path / f"{IMAGES}.gz").write_bytes(gzip.compress(b"\x00\x00\x08\x03"))
    with pytest.raises(IdxError, match="too short"):
        read_idx(tmp_path / f"{IMAGES}.gz", 3)


def test_mnist_is_streamed_by_epochs_and_held_out_from_its_t10k_files(tmp_path):
    """MNIST is a data set like the user's: its training files by epochs (gpubench.workloads.dataset),
    its t10k files the held-out split, where they are there."""
    from gpubench.workloads.dataset import split_pool

    tiny_mnist(tmp_path, n=50)
    config = Config(workload="cnn", dataset="mnist", data_dir=str(tmp_path), batch_size=16, warmup_steps=0, steps=3,
                    windows=2)
    facts: dict = {}
    make, held = split_pool(config, facts)
    assert make(16, 1).x.shape == (7, 16, 1, 28, 28) and held is None  # 1 + 2 x 3 steps, 3 a 48-sample epoch
    assert facts["form"] == "MNIST files" and facts["samples_per_epoch"] == 48
    both = tmp_path / "both"  # (a process reads a directory once)
    _, labels = tiny_mnist(both, n=20, seed=1)
    for name, test_name in ((IMAGES, TEST_IMAGES), (LABELS, TEST_LABELS)):
        (both / name).rename(both / test_name)
        shutil.copy(tmp_path / name, both / name)
    facts = {}
    make, held = split_pool(replace(config, data_dir=str(both), target_loss=1.0), facts)
    assert held is not None and held(16).y.reshape(-1).tolist() == labels.tolist()  # all 20, in one batch
    assert facts["evaluated_samples"] == 20 and facts["eval_batch"] == 20


def test_torch_pipeline_mode_trains_on_the_same_batches():
    pytest.importorskip("torch")
    from gpubench.backends import get_backend
    from gpubench.workloads.data import synthetic_batches

    spec = get_workload("mlp").spec(depth=1, width=32)
    batches = synthetic_batches(spec, 16, 6, seed=0)
    out = {}
    for data, workers in (("device", 2), ("pipeline", 0), ("pipeline", 2)):
        config = Config(workload="mlp", batch_size=16, optimizer="sgd", lr=0.01, data=data, data_workers=workers,
                        workload_params=(("depth", 1), ("width", 32)))
        trainer = get_backend("torch").build(spec, config, batches)
        losses = []
        for _ in range(14):  # wraps around the 6 batches twice
            trainer.step()
            losses.append(trainer.read_loss())
        out[(data, workers)] = losses
        assert trainer.describe()["data"].startswith("DataLoader" if data == "pipeline" else "device")
        loader_workers = [w.pid for w in trainer._iter._workers] if workers and data == "pipeline" else []
        trainer.close()
        assert not any(psutil.pid_exists(pid) for pid in loader_workers)  # ended now, not at a later gc
    assert out[("pipeline", 0)] == pytest.approx(out[("device", 2)], rel=1e-6)
    assert out[("pipeline", 2)] == pytest.approx(out[("device", 2)], rel=1e-6)


PIPELINE = next(c for c in COMPARISONS if c.axis == "data")


def pipeline_speedups(results) -> list[dict]:
    return speedups(aggregate(results_frame(results)), PIPELINE).to_dict("records")


def test_pipeline_mode_is_compared_with_its_device_twin():
    dev = Config(workload="cnn")
    pipe = Config(workload="cnn", data="pipeline", data_workers=4)
    earlier = [make_result(dev, 90.0), make_result(dev, 110.0, repeat=1), make_result(dev, status="error", repeat=2),
               make_result(Config(workload="mlp"), 1.0)]
    for results in ([*earlier, make_result(pipe, 50.0)], [make_result(pipe, 50.0), *earlier]):
        (found,) = pipeline_speedups(results)
        assert {k: found[k] for k in ("run", "workload_label", "config_id", "baseline_id", "speedup")} == {
            "run": "r", "workload_label": "cnn", "config_id": pipe.config_id, "baseline_id": dev.config_id,
            "speedup": 0.5}
    assert pipe.config_id == dev.config_id + "-data=pipeline-data_workers=4"
    assert pipeline_speedups([make_result(pipe)]) == []


@pytest.mark.slow
def test_run_records_how_much_slower_pipeline_mode_is(tmp_path, write_suite):
    pytest.importorskip("torch")
    tiny_mnist(tmp_path / "mnist", n=96)
    suite = write_suite(f"""
[defaults]
workload = "mlp"
depth = 1
width = 16
batch_size = 16
warmup_steps = 1
steps = 4
windows = 2
data_workers = 0
dataset = "mnist"
data_dir = "{tmp_path / 'mnist'}"
[matrix]
data = ["device", "pipeline"]
""")
    proc = run_cli(["run", str(suite), "--out", str(tmp_path / "runs")], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = list((tmp_path / "runs").iterdir())
    device, pipeline = result_lines(run_dir)
    assert device["status"] == pipeline["status"] == "ok"
    # the pool holds the steps the config trains (1 cold + 1 warm-up + 2 x 4), epochs of the 96 samples
    assert device["config"]["dataset"] == "mnist" and device["metrics"]["memory"]["data_bytes"] == 10 * 16 * (784 * 4 + 8)
    assert device["runtime"]["dataset"]["pool_epochs"] == pytest.approx(160 / 96, abs=1e-3)
    (cmp,) = pipeline_speedups(load_results(run_dir))
    assert (cmp["config_id"], cmp["baseline_id"]) == (pipeline["config_id"], device["config_id"])
    assert cmp["speedup"] == pytest.approx(pipeline["metrics"]["throughput"]["median"]
                                           / device["metrics"]["throughput"]["median"])
    assert "Input pipeline over device-resident data" in (tmp_path / "reports" / run_dir.name / "summary.md").read_text()


@pytest.mark.parametrize("extra, message", [
    ('dataset = "mnist"', "data_dir: dataset 'mnist' needs data_dir"),
    ('dataset = "mnist"\ndata_dir = "{missing}"', f"data_dir: {{missing}}: no {IMAGES}"),
    ('dataset = "imagenet"', "defaults.dataset: unknown dataset 'imagenet'; expected one of: synthetic, mnist"),
    ('data = "disk"', "defaults.data: unknown data mode 'disk'; expected one of: device, pipeline"),
    ('data_workers = -1', "defaults.data_workers: must be >= 0"),
])
def test_bad_data_settings_exit_2_before_anything_is_written(tmp_path, write_suite, extra, message):
    missing = tmp_path / "nowhere"
    suite = write_suite('[defaults]\nworkload = "cnn"\n' + extra.format(missing=missing) + "\n")
    proc = run_cli(["run", str(suite), "--out", str(tmp_path / "runs")], cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message.format(missing=missing) in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_every_framework_is_compared_with_the_reference_one():
    """The report's framework comparison: each framework's twin config over PyTorch's, TensorFlow
    and JAX alike, and never PyTorch over itself."""
    framework = next(c for c in COMPARISONS if c.axis == "framework")
    assert framework.title == "Framework over PyTorch" and framework.baseline == "torch"
    configs = {f: Config(workload="mlp", framework=f, batch_size=256) for f in ("torch", "tensorflow", "jax")}
    results = [make_result(configs["torch"], 100.0), make_result(configs["tensorflow"], 50.0),
               make_result(configs["jax"], 150.0), make_result(Config(workload="mlp", framework="jax"), 80.0)]
    rows = speedups(aggregate(results_frame(results)), framework).to_dict("records")
    assert sorted((r["config_id"], r["baseline_id"], r["speedup"]) for r in rows) == sorted([
        (configs["tensorflow"].config_id, configs["torch"].config_id, 0.5),
        (configs["jax"].config_id, configs["torch"].config_id, 1.5)])

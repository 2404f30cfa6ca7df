"""Your own data (dataset = "module:function", held_out): every form a user hands over read as the
same two arrays, the training split streamed by epochs shuffled with the seed, the held-out split
evaluated whole; bad input one line, exit 2, nothing written (on the fake backend); the digits
end to end in the three frameworks, against a plain PyTorch loop (slow)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpubench.config import Config
from gpubench.workloads.dataset import DataError, Split, held_out_batches, stream_batches, to_split
from tests.conftest import REPO, plugin_env, requires, result_lines, run_cli

X = np.arange(40, dtype=np.float32).reshape(10, 4)  # 10 samples of 4 features
Y = np.arange(10, dtype=np.int64) % 3


def test_every_form_is_read_as_the_same_two_arrays():
    """NumPy arrays, a framework's tensors, a list or generator of batches, a PyTorch
    TensorDataset, DataLoader, map-style and iterable Dataset of the user's own, a tf.data.Dataset
    of samples or batched: each the same inputs (float32) and labels (int64), and its form named."""
    requires("torch", "tensorflow")
    import tensorflow as tf
    import torch
    from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

    class Mapped(Dataset):
        def __len__(self):
            return 10

        def __getitem__(self, i):
            return torch.from_numpy(X[i]), int(Y[i])

    class Streamed(IterableDataset):
        def __iter__(self):
            return iter(zip(X, Y))

    tensors = TensorDataset(torch.from_numpy(X), torch.from_numpy(Y))
    forms = {
        "arrays": (X, Y),
        "tensors": (torch.from_numpy(X), torch.from_numpy(Y)),
        "tf tensors": (tf.constant(X), tf.constant(Y)),
        "batches": [(X[:4], Y[:4]), (X[4:8], Y[4:8]), (X[8:], Y[8:])],
        "generator": ((X[i: i + 5], Y[i: i + 5]) for i in (0, 5)),
        "TensorDataset": tensors,
        "DataLoader": DataLoader(tensors, batch_size=3),
        "Dataset (Mapped)": Mapped(),
        "IterableDataset (Streamed)": Streamed(),
        "tf.data samples": tf.data.Dataset.from_tensor_slices((X, Y)),
        "tf.data.Dataset": tf.data.Dataset.from_tensor_slices((X, Y)).batch(4),
        "columns": {"pixel_values": X, "label": Y},  # a Hugging Face dataset's columns
        "rows": [{"pixel_values": X[i: i + 5], "labels": Y[i: i + 5]} for i in (0, 5)],  # its batches
    }
    for name, obj in forms.items():
        split = to_split(obj, "dataset 'm:f'")
        assert np.array_equal(split.x, X) and split.x.dtype == np.float32, name
        assert np.array_equal(split.y, Y) and split.y.dtype == np.int64, name
        assert split.input_shape == (4,) and split.classes == 3 and not split.truncated, name
    forms = {name: to_split(obj, "k").form for name, obj in forms.items() if name not in ("generator",)}
    assert forms == {"arrays": "arrays", "tensors": "arrays", "tf tensors": "arrays", "batches": "batches", "TensorDataset": "TensorDataset",
                     "DataLoader": "DataLoader", "Dataset (Mapped)": "Mapped", "IterableDataset (Streamed)": "Streamed",
                     "tf.data samples": "TensorSliceDataset", "tf.data.Dataset": "BatchDataset", "columns": "arrays",
                     "rows": "batches"}  # what was handed: the class of the object, or arrays, or batches
    assert to_split((X.astype(np.uint8), Y), "k").x.dtype == np.float32  # pixels are values
    assert to_split((X.astype(np.int32), Y), "k").x.dtype == np.int64  # signed integers are token ids
    endless = to_split((b for b in iter(lambda: (X, Y), None)), "dataset 'm:f'", limit_bytes=1000)
    assert endless.truncated and endless.samples == 50  # 5 batches of 240 bytes: read until its budget, and said


@pytest.mark.parametrize("obj, message", [
    (42, "dataset 'm:f': returned a int; expected a PyTorch Dataset or DataLoader, a tf.data.Dataset, a pair of "
         "arrays (inputs, targets), or an iterable of (inputs, targets) batches (each pair possibly a mapping"),
    ((X[:0], Y[:0]), "dataset 'm:f': the split is empty"),
    ([(X, Y, Y)], "dataset 'm:f': an item is a tuple; expected (inputs, targets), or a mapping of the inputs and one "
                  "of label, labels, target, targets, y"),
    ((X, X), "dataset 'm:f': targets of shape [10, 4] and type float32; expected one integer class label a sample"),
    ((X, Y - 1), "dataset 'm:f': a class label -1; labels are 0, 1, ..."),
])
def test_a_split_of_no_known_form_is_one_line(obj, message):
    with pytest.raises(DataError) as e:
        to_split(obj, "dataset 'm:f'")
    assert str(e.value).startswith(message), str(e.value)


def test_the_training_split_is_streamed_by_epochs_shuffled_with_the_seed_and_trial():
    """Each epoch a permutation of the split of its own (seed, trial, epoch); drop_last drops an
    epoch's last partial step, without it the next epoch's samples complete it; a step's micro-batches
    are one batch of batch x group cut (accumulation trains on what the big batch would); the pool
    holds the steps the config trains, and says so."""
    split = Split(X, Y, "arrays")
    config = Config(workload="mlp", dataset="m:f", batch_size=3, warmup_steps=0, steps=5, windows=1)
    facts: dict = {}
    pool = stream_batches(split, 3, 1, config, facts)
    assert pool.x.shape == (6, 3, 4) and pool.y.shape == (6, 3)  # the cold step and 5 measured
    rows = pool.x.reshape(-1, 4)[:, 0].astype(int) // 4  # each sample's index in the split
    first, second = rows[:9], rows[9:]
    assert len(set(first)) == 9 and len(set(second)) == 9 and not np.array_equal(first, second)  # 1 of 10 dropped
    assert facts == {"source": "dataset m:f", "form": "arrays", "train_samples": 10, "input_shape": [4],
                     "classes": 3, "drop_last": True, "samples_per_epoch": 9, "pool_batches": 6, "pool_epochs": 2.0}
    assert np.array_equal(stream_batches(split, 3, 1, config, {}).x, pool.x)  # the seed makes the orders
    other = stream_batches(split, 3, 1, Config(**{**config.to_dict(), "seed": 1}), {})
    trial = stream_batches(split, 3, 1, Config.from_dict({**config.to_dict(), "trial": 1}), {})
    assert not np.array_equal(other.x, pool.x) and not np.array_equal(trial.x, pool.x)

    kept = stream_batches(split, 3, 1, Config.from_dict({**config.to_dict(), "drop_last": False}), {})
    rows = kept.x.reshape(-1, 4)[:, 0].astype(int) // 4
    assert sorted(rows[:10]) == list(range(10)) and len(set(rows[10:])) == 8  # every sample of the first epoch
    big = stream_batches(split, 4, 1, config, {})
    accumulated = stream_batches(split, 2, 2, config, {})
    assert np.array_equal(accumulated.x.reshape(-1, 4), big.x.reshape(-1, 4))
    with pytest.raises(DataError, match="10 samples, fewer than one step's 12 \\(2 x 6\\)"):
        stream_batches(split, 6, 2, config, {})


def test_the_held_out_split_is_evaluated_whole_in_equal_batches():
    """Equal batches, so that the mean of their mean losses is the mean over every sample: the
    largest divisor of the split up to the batch cap; a prime count in batches of the config's
    batch, the remainder left out and the count evaluated said; eval_samples takes the first."""
    split = Split(np.zeros((360, 2), np.float32), np.zeros(360, np.int64), "arrays")
    facts: dict = {}
    batches = held_out_batches(split, 32, 0, facts)
    assert batches.x.shape == (2, 180, 2) and facts == {"held_out_samples": 360, "evaluated_samples": 360,
                                                        "eval_batch": 180}
    prime = Split(np.zeros((359, 2), np.float32), np.zeros(359, np.int64), "arrays")
    assert held_out_batches(prime, 32, 0, facts).x.shape == (11, 32, 2) and facts["evaluated_samples"] == 352
    assert held_out_batches(split, 32, 100, facts).x.shape == (1, 100, 2) and facts["evaluated_samples"] == 100


DATA = '''
import numpy as np

rng = np.random.default_rng(0)
templates = rng.standard_normal((3, 16)).astype(np.float32)


def _draw(n, seed):
    r = np.random.default_rng(seed)
    y = r.integers(0, 3, n)
    return (templates[y] + 0.5 * r.standard_normal((n, 16))).astype(np.float32), y


def train():
    return _draw(200, 1)


def held():
    return _draw(60, 2)


def held_wide():
    x, y = _draw(60, 2)
    return np.concatenate([x, x], axis=1), y


def held_more_classes():
    x, y = _draw(60, 2)
    return x, y + 1


def nothing():
    return None


def empty():
    return np.zeros((0, 16), np.float32), np.zeros(0, np.int64)
'''

OWN = """
name = "own"
[defaults]
framework = "fake"
workload = "fault"
dataset = "data:train"
held_out = "data:held"
batch_size = 8
target_loss = 0.3
lr = 0.1
eval_every = 5
max_steps = 300
"""


def test_a_built_in_trains_on_your_data_set_to_a_target(tmp_path):
    """End to end on the fake backend: the built-in takes the data's input and classes, trains by
    epochs to the target on the held-out split, the result says what the data held, and the report
    draws its held-out curve against the epochs trained."""
    (tmp_path / "data.py").write_text(DATA)
    (tmp_path / "s.toml").write_text(OWN)
    proc = run_cli(["run", "s.toml", "--out", "runs"], cwd=tmp_path, env=plugin_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    (r,) = result_lines(run_dir)
    assert r["status"] == "ok" and r["metrics"]["target"]["reached"], r["reason"]
    data = r["runtime"]["dataset"]
    assert data["form"] == "arrays" and data["train_samples"] == 200 and data["input_shape"] == [16]
    assert data["classes"] == 3 and data["evaluated_samples"] == 60 and data["samples_per_epoch"] == 200
    steps = r["metrics"]["target"]["steps_to_target"]
    assert data["pool_batches"] == 301 and data["pool_epochs"] == pytest.approx(301 * 8 / 200)
    assert r["model"]["params"] == 16 * 3 + 3 and steps >= 5  # the spec for 16 inputs and 3 classes
    (report,) = (tmp_path / "reports").iterdir()  # the report beside the runs
    assert (report / "charts" / "held_out_vs_epoch.png").stat().st_size > 0


@pytest.mark.parametrize("change, message", [
    ('dataset = "data:nothing"', "dataset 'data:nothing': returned a NoneType; expected a PyTorch Dataset"),
    ('dataset = "data:empty"', "dataset 'data:empty': the split is empty"),
    ('held_out = "data:held_wide"', "held_out 'data:held_wide': samples of shape [32] (float32) where the training "
                                    "split's are [16] (float32)"),
    ('held_out = "data:held_more_classes"', "held_out 'data:held_more_classes': a class label 3, outside the 3 "
                                            "classes of the training split"),
    ("num_classes = 2", "dataset 'data:train': a class label 2, outside num_classes = 2"),
    ('dataset = "data:nope"', "dataset 'data:nope': module data has no 'nope'"),
    ('dataset = "synthetic"', 'held_out: a held-out split goes with your data set (dataset = "module:function"), '
                              "not dataset = 'synthetic'"),
    ('held_out = ""', "held_out: target_loss on dataset = 'data:train' is evaluated on a held-out split"),
    ('batches = "data:train"', "batches: one source of training data"),
    ("drop_last = 1", "s.toml: defaults.drop_last: expected true or false, got 1"),
    ('dataset = "digits"', "s.toml: defaults.dataset: unknown dataset 'digits'; expected one of: synthetic, mnist, "
                             'or a function "module:function" returning the training split'),
])
def test_bad_data_is_one_line_and_exit_2_before_any_worker_trains(tmp_path, change, message):
    (tmp_path / "data.py").write_text(DATA)
    key = change.split(" = ")[0]
    suite = re.sub(rf"^{key} = .*$", change, OWN, flags=re.M) if f"\n{key} = " in OWN else OWN + change + "\n"
    (tmp_path / "s.toml").write_text(suite)
    proc = run_cli(["run", "s.toml", "--out", "runs"], cwd=tmp_path, env=plugin_env())
    assert proc.returncode == 2 and message in proc.stderr, proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "runs").exists()


def _plain_loop_steps(project: Path, seeds: int) -> list[int]:
    out = subprocess.run([sys.executable, "plain_loop.py", str(seeds)], cwd=project, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    return [int(s) for s in out.stdout.split()]


@pytest.mark.slow
def test_the_digits_reach_the_target_as_a_plain_loop_does_in_every_form_and_framework(tmp_path):
    """examples/own-data as docs/own-model.md runs it: the digits as a TensorDataset, a factory
    MLP and Adam reach a held-out loss of 0.15 in the steps a plain PyTorch loop over the same
    split takes (5 seeds each, within the loop's own spread); the built-in MLP on the arrays
    reaches it in the same steps with the same held-out losses in PyTorch, JAX and TensorFlow; a
    tf.data.Dataset trains JAX and TensorFlow, a TensorDataset JAX (through NumPy), a DataLoader
    pipeline PyTorch, each to the target."""
    requires("sklearn", "torch", "tensorflow", "jax")
    project = tmp_path / "own-data"
    shutil.copytree(REPO / "examples" / "own-data", project)
    proc = run_cli(["run", "suite.toml", "--out", "runs/factory", "--repeats", "5", "--no-report", "--no-calibrate"],
                   cwd=project, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = (project / "runs" / "factory").iterdir()
    ours = sorted(r["metrics"]["target"]["steps_to_target"] for r in result_lines(run_dir))
    loop = sorted(_plain_loop_steps(project, 5))
    assert len(ours) == 5 and abs(np.median(ours) - np.median(loop)) <= max(loop) - min(loop) + 20, (ours, loop)

    builtin = (project / "builtin.toml").read_text() + """
[[matrix.include]]
framework = "jax"
dataset = "digits:train_tf"
held_out = "digits:held_out_tf"
[[matrix.include]]
framework = "tensorflow"
dataset = "digits:train_tf"
held_out = "digits:held_out_tf"
[[matrix.include]]
framework = "jax"
dataset = "digits:train_dataset"
held_out = "digits:held_out_dataset"
[[matrix.include]]
framework = "torch"
data = "pipeline"
data_workers = 0
"""
    (project / "forms.toml").write_text(builtin)
    proc = run_cli(["run", "forms.toml", "--out", "runs/forms", "--no-report", "--no-calibrate"], cwd=project,
                   timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = (project / "runs" / "forms").iterdir()
    results = result_lines(run_dir)
    assert len(results) == 7 and all(r["status"] == "ok" for r in results), [r["reason"] for r in results]
    arrays = {r["config"]["framework"]: r["metrics"]["target"] for r in results
              if r["runtime"]["dataset"]["form"] == "arrays" and r["config"]["data"] == "device"}
    assert sorted(arrays) == ["jax", "tensorflow", "torch"]
    for framework in ("jax", "tensorflow"):
        assert arrays[framework]["steps_to_target"] == arrays["torch"]["steps_to_target"], framework
        assert [e[2] for e in arrays[framework]["evaluations"]] == pytest.approx(
            [e[2] for e in arrays["torch"]["evaluations"]], rel=0.02)
    forms = {(r["config"]["framework"], r["runtime"]["dataset"]["form"], r["config"]["data"]) for r in results}
    assert {("jax", "BatchDataset", "device"), ("tensorflow", "BatchDataset", "device"),
            ("jax", "TensorDataset", "device"), ("torch", "arrays", "pipeline")} <= forms
    json.dumps(results)  # every result line is JSON


def test_labels_the_factory_model_does_not_score_are_one_line(tmp_path):
    """A factory's model that scores fewer classes than the data set's labels: refused before any
    worker trains (the framework's cross-entropy would fail at the first step, or not at all)."""
    requires("torch")
    (tmp_path / "data.py").write_text(DATA + '''

def model():
    from torch import nn

    return nn.Linear(16, 2)
''')
    (tmp_path / "s.toml").write_text('name = "few"\n[defaults]\nworkload = "data:model"\ndataset = "data:train"\n')
    proc = run_cli(["run", "s.toml", "--out", "runs"], cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "gpubench: error: s.toml: dataset 'data:train': a class label 2, but the model scores 2 classes (its output "
        "Tensor [2, 2])"], proc.stdout + proc.stderr
    assert not (tmp_path / "runs").exists()

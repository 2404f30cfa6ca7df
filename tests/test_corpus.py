"""The acceptance corpus: small model definitions of the shapes users write (tests/corpus/), each
written for these tests, each built and trained by its framework's backend as a worker does.

- gpt.py: a GPT as nanoGPT writes one, ``(logits, loss)`` outputs, fused attention;
- encoder.py: an encoder of a dict of inputs (token ids, an attention mask), a dict output;
- twoinput.py: two inputs as a tuple, a dataclass output;
- keras_text.py: a Keras subclassed model of token ids, a class per sequence, (logits, loss) given
  the targets;
- flax_lm.py: a Flax language model with dropout.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import REPO, plugin_env, requires, result_lines, run_cli

CORPUS = REPO / "tests" / "corpus"

# (framework, settings, the task the model trains on, what its first training steps must show)
MODELS = {
    "gpt": ("torch", {"workload": "gpt:gpt", "input_shape": (64,), "loss_output": "1"}, "tokens"),
    "encoder": ("torch", {"workload": "encoder:encoder", "batches": "encoder:encoder_batches"}, None),
    "two_input": ("torch", {"workload": "twoinput:two_input", "batches": "twoinput:two_input_batches"}, None),
    "keras_text": ("tensorflow", {"workload": "keras_text:text_classifier", "input_shape": (32,)}, "sequences"),
    "flax_lm": ("jax", {"workload": "flax_lm:flax_lm", "input_shape": (32,), "input_kind": "tokens"}, "tokens"),
    # the same module given the targets: the loss it computes (loss_output), in JAX
    "flax_lm_own_loss": ("jax", {"workload": "flax_lm:flax_lm", "input_shape": (32,), "input_kind": "tokens",
                                 "loss_output": "1"}, "tokens"),
}
PACKAGES = {"torch": "torch", "tensorflow": "tensorflow", "jax": "flax"}


# here in pytest's process: PyTorch's (quick to import), and Flax's with its own loss (no end-to-end
# test has it); Keras' and the plain Flax model are test_run_takes_every_corpus_model's
@pytest.mark.parametrize("name", ["gpt", "encoder", "two_input", "flax_lm_own_loss"])
def test_each_corpus_model_builds_counts_and_trains(monkeypatch, name):
    """Built as the worker builds it (its task told from the model, its FLOPs counted), then
    three training steps: a finite loss, and the token models' tasks of token ids."""
    from gpubench.backends import get_backend
    from gpubench.config import Config

    framework, settings, task = MODELS[name]
    requires(PACKAGES[framework])
    monkeypatch.syspath_prepend(str(CORPUS))
    config = Config(framework=framework, batch_size=8, lr=1e-3, **settings)
    backend = get_backend(framework)
    assert backend.unsupported(config) is None
    native = backend.native(config)
    facts = native.facts
    assert facts.get("task") == task and facts["params"] > 0
    assert facts["flops_per_sample"] and facts["flops_per_sample"] > 0, facts.get("flops_note")
    if task is not None:
        assert facts["input_shape"] == list(settings["input_shape"])
    else:  # a batch function's: tokens/s where its inputs are token ids (the encoder's ids and mask, 32 each)
        assert facts.get("tokens_per_sample") == {"encoder": 32}.get(name), facts
    pool = native.make_batches(8, 1)
    trainer = backend.build(native, config, pool)
    losses = []
    for _ in range(3):
        trainer.step()
        losses.append(trainer.read_loss())
    assert all(math.isfinite(v) for v in losses), losses
    x = pool.x[0] if isinstance(pool.x, tuple) else pool.x
    if task is not None:
        assert isinstance(x, np.ndarray) and x.dtype.kind == "i"


def _docs_example() -> tuple[str, str]:
    """docs/own-model.md's language model: its suite (lm.toml) and the line that refuses it
    without loss_output."""
    doc = (REPO / "docs" / "own-model.md").read_text()
    suite = re.search(r"```toml\n# lm.toml\n(.*?)```", doc, re.S).group(1)
    refused = re.search(r"Without `loss_output` the check.*?```text\n(.*?)\n```", doc, re.S).group(1)
    return suite, refused


@pytest.mark.slow
def test_the_docs_language_model_without_its_loss_output_is_the_pages_line(tmp_path):
    """The page's suite without loss_output: the check before the run gives the page's line,
    exit 2, and makes no run (the suite as written trains in test_run_takes_every_corpus_model)."""
    suite, refused = _docs_example()
    shutil.copy(CORPUS / "gpt.py", tmp_path / "gpt.py")
    (tmp_path / "lm.toml").write_text("".join(line for line in suite.splitlines(True) if "loss_output" not in line))
    proc = run_cli(["run", "lm.toml", "--out", "runs", "--no-calibrate"], cwd=tmp_path, timeout=300)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == refused, proc.stderr
    assert not (tmp_path / "runs").exists()


# every corpus model in one suite, each command below takes them all in one invocation: the
# language model of docs/own-model.md's suite as written there (the GPT at two precisions), then
# the others, at fp32 (Keras' with the loss it computes; the pytest fixture trains it with gpubench's)
OTHERS = """
[[matrix.include]]
workload = ["encoder:encoder"]
batches = ["encoder:encoder_batches"]
loss_output = [""]
precision = ["fp32"]
[[matrix.include]]
workload = ["twoinput:two_input"]
batches = ["twoinput:two_input_batches"]
loss_output = [""]
precision = ["fp32"]
[[matrix.include]]
workload = ["keras_text:text_classifier"]
framework = ["tensorflow"]
input_shape = [[32]]
loss_output = ["1"]
precision = ["fp32"]
[[matrix.include]]
workload = ["flax_lm:flax_lm"]
framework = ["jax"]
input_shape = [[32]]
input_kind = ["tokens"]
loss_output = [""]
precision = ["fp32"]
"""
CORPUS_SUITE = _docs_example()[0] + OTHERS
FAST = [a for kv in ("steps=3", "windows=2", "warmup_steps=1", "threads=1", "batch_size=8") for a in ("--set", kv)]
TOKEN_MODELS = {"gpt:gpt", "keras_text:text_classifier", "flax_lm:flax_lm"}


@pytest.fixture
def corpus_project(tmp_path):
    """The corpus' model files and its suite, as a user's project."""
    for path in CORPUS.glob("*.py"):
        shutil.copy(path, tmp_path / path.name)
    (tmp_path / "corpus.toml").write_text(CORPUS_SUITE)
    return tmp_path


@pytest.mark.slow
def test_run_takes_every_corpus_model(corpus_project):
    """``run`` of the five models in real workers: each trains (a finite loss, a FLOP count,
    tokens/s for the models of token ids)."""
    requires("tensorflow", "flax")
    proc = run_cli(["run", "corpus.toml", "--out", "runs", "--no-calibrate", "--no-report", *FAST],
                   cwd=corpus_project, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = (corpus_project / "runs").iterdir()
    lines = result_lines(run_dir)
    # the docs' suite: the GPT at fp32 and amp-bf16, on tokens with its own loss
    assert [r["config"]["precision"] for r in lines if r["config"]["workload"] == "gpt:gpt"] == ["fp32", "amp-bf16"]
    results = {r["config"]["workload"]: r for r in lines}  # (the GPT's amp-bf16 result)
    assert len(lines) == 6 and len(results) == 5
    for workload, r in results.items():
        assert r["status"] == "ok", (workload, r.get("reason"))
        assert math.isfinite(r["metrics"]["loss"]["last"]) and r["model"]["flops_per_sample"] > 0, workload
        assert (r["model"].get("task") in ("tokens", "sequences")) == (workload in TOKEN_MODELS), workload
    assert results["gpt:gpt"]["model"]["flops_per_sample"] == 50331648  # attention counted (tests/test_own_model.py)
    keras_text = results["keras_text:text_classifier"]["model"]  # an embedding first, a class per sequence,
    assert results["keras_text:text_classifier"]["config"]["loss_output"] == "1"  # trained on its own loss
    assert keras_text["task"] == "sequences" and keras_text["num_classes"] == 4
    assert "a class of 4 per sequence of 32 tokens over a vocabulary of 128" in keras_text["notes"][0]
    # the progress line of each config on token ids: the GPT's two, Keras', Flax's and the encoder's
    assert proc.stdout.count("tokens/s,") == 5


@pytest.mark.slow
def test_profile_takes_every_corpus_model(corpus_project):
    """``profile`` of the five models: each has its operator table, PyTorch's traces their steps."""
    requires("tensorflow", "flax")
    proc = run_cli(["profile", "corpus.toml", "--out", "profiles", "--steps", "2", "--no-report", *FAST, "--set",
                    "precision=fp32"], cwd=corpus_project, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (profile_dir,) = (corpus_project / "profiles").iterdir()
    profiled = result_lines(profile_dir)
    assert len(profiled) == 5
    for r in profiled:
        assert r["status"] == "ok" and r["profile"]["top_cpu"], (r["config_id"], r.get("reason"))
        assert (profile_dir / "profile" / r["config_id"] / "top_ops.md").is_file()
    traces = list(profile_dir.rglob("rank0.pt.trace.json"))  # PyTorch's three: their steps marked
    assert len(traces) == 3 and all("ProfilerStep#" in t.read_text() for t in traces)


FIXTURE_TEST = """
import math

import pytest

MODELS = [
    dict(workload="gpt:gpt", input_shape=(64,), loss_output="1"),
    dict(workload="encoder:encoder", batches="encoder:encoder_batches"),
    dict(workload="twoinput:two_input", batches="twoinput:two_input_batches"),
    dict(workload="keras_text:text_classifier", framework="tensorflow", input_shape=(32,)),
    dict(workload="flax_lm:flax_lm", framework="jax", input_shape=(32,), input_kind="tokens"),
]


@pytest.mark.parametrize("settings", MODELS, ids=lambda s: s["workload"])
def test_corpus(gpubench_benchmark, settings):
    step = gpubench_benchmark(**settings, batch_size=8, threads=1, steps_per_round=2, rounds=3, warmup_rounds=1)
    assert step.throughput > 0 and math.isfinite(step.loss()) and step.model["flops_per_sample"] > 0
"""


@pytest.mark.slow
def test_the_pytest_fixture_times_every_corpus_model(corpus_project):
    """The pytest fixture in one pytest process, as a user's test suite runs it: the corpus and the
    example project's models (a batch function, a zoo's language model, Keras beside PyTorch),
    and a misspelt factory that fails its test with one line."""
    from tests.test_own_model import EXAMPLE
    from tests.test_own_model import FIXTURE_TEST as EXAMPLE_FIXTURE_TEST

    requires("tensorflow", "flax", "transformers")
    shutil.copy(EXAMPLE / "mymodels.py", corpus_project / "mymodels.py")
    (corpus_project / "test_corpus_fixture.py").write_text(FIXTURE_TEST)
    (corpus_project / "test_example_fixture.py").write_text(EXAMPLE_FIXTURE_TEST)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                           "test_corpus_fixture.py", "test_example_fixture.py", "--rootdir", str(corpus_project)],
                          cwd=corpus_project, env=plugin_env(), capture_output=True, text=True, timeout=600)
    assert "1 failed, 9 passed" in proc.stdout, proc.stdout + proc.stderr
    assert "During handling" not in proc.stdout
    assert "gpubench_benchmark: workload 'mymodels:nope': module mymodels has no 'nope'" in proc.stdout
    counted = dict(re.findall(r"FLOPS (\S+) (\S+)", proc.stdout))
    # the tagger's LSTM has no formula in PyTorch's counter: no count rather than a low one
    assert counted["mymodels:tagger"] == "None", counted
    assert int(counted["hf:gpt2"]) > 0 and int(counted["mymodels:keras_convnet"]) > 0, counted

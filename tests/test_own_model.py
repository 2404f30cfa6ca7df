"""The user's own model: factories ("module:function"), zoo models by name, batch and loss
functions, through run, the fixture, ab, profile and the Python API; and every bad input's line."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import tomllib

from tests.conftest import REPO, plugin_env, requires, result_lines, run_cli

torch = pytest.importorskip("torch")

EXAMPLE = REPO / "examples" / "own-model"
FAST = {"batch_size": 4, "warmup_steps": 1, "steps": 3, "windows": 2, "threads": 1}


def fast_lines() -> str:
    return "\n".join(f"{k} = {v}" for k, v in FAST.items())


@pytest.fixture
def project(tmp_path):
    """A copy of the example project (its model code and suite)."""
    dest = tmp_path / "project"
    shutil.copytree(EXAMPLE, dest)
    return dest


# --- names and settings -------------------------------------------------------------------------

def test_workload_names_parse_into_their_source():
    from gpubench.backends import backend_class
    from gpubench.workloads.source import parse_workload

    builtins = ["cnn", "mlp"]
    assert parse_workload("cnn", builtins).kind == "builtin"
    ref = parse_workload("pkg.models:make_net", builtins)
    assert (ref.kind, ref.module, ref.name, ref.label) == ("factory", "pkg.models", "make_net", "pkg.models.make_net")
    ref = parse_workload("timm:vit_tiny_patch16_224", builtins)
    assert (ref.kind, ref.module, ref.name, ref.zoo.name) == ("zoo", "timm", "vit_tiny_patch16_224", "timm")
    # each zoo's models train in the framework whose backend names it
    assert ref.zoo.name in backend_class("torch").zoos and "keras" in backend_class("tensorflow").zoos
    with pytest.raises(ValueError, match=r"unknown workload 'resnet9'; expected one of: cnn, mlp; or a factory"):
        parse_workload("resnet9", builtins)
    with pytest.raises(ValueError, match="is not \"module:function\""):
        parse_workload("my-models:f()", builtins)


def test_suite_keys_of_a_factory_make_its_configs(tmp_path):
    from gpubench.suite import load_suite

    path = tmp_path / "s.toml"
    path.write_text('[matrix]\nworkload = ["mymodels:small_convnet", "cnn"]\nargs.width = [8, 16]\n'
                    '[defaults]\ninput_shape = [3, 32, 32]\nnum_classes = 10\n')
    configs = load_suite(str(path)).expand()
    ids = [c.config_id for c in configs]
    assert ids == ["mymodels.small_convnet_width8-torch-cpu-bs64-fp32-single",
                   "mymodels.small_convnet_width16-torch-cpu-bs64-fp32-single",
                   "cnn-torch-cpu-bs64-fp32-single"]  # the built-in ignores the factory's settings: one point
    assert configs[0].workload_params == (("width", 8),) and configs[0].input_shape == (3, 32, 32)
    assert configs[2].input_shape == () and configs[2].workload_params == ()
    # a built-in's hash is what it was before these settings existed
    from gpubench.config import Config

    assert Config(workload="cnn").config_hash == "a737ac528d48"


@pytest.mark.parametrize("text, message", [
    ('[defaults]\nworkload = "mymodels:f"\ninput_shape = [3, 0]\n', "defaults.input_shape: expected a list of 1 to 8"),
    ('[defaults]\nworkload = "mymodels:f"\nbatches = "nocolon"\n', 'batches: expected "module:function"'),
    ('[defaults]\nworkload = "mymodels:f"\nloss = "mse"\n', "unknown loss 'mse'; expected one of: cross_entropy, or"),
    ('[defaults]\nworkload = "cnn"\nargs.width = 3\n', "no workload in this suite takes 'args.width'"),
    ('[defaults]\nworkload = "mymodels:f"\nargs.width = [1, 2]\n', "sweep lists belong in [matrix]"),
])
def test_bad_settings_of_a_factory_name_file_and_key(tmp_path, text, message):
    from gpubench.errors import InputError
    from gpubench.suite import load_suite

    path = tmp_path / "s.toml"
    path.write_text(text)
    with pytest.raises(InputError) as err:
        load_suite(str(path))
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value), str(err.value)


def test_set_input_shape_with_commas_narrows_the_includes(tmp_path):
    from gpubench.suite import load_suite

    path = tmp_path / "s.toml"
    path.write_text('[matrix]\nworkload = ["m:a"]\ninput_shape = [[3, 8, 8]]\n'
                    '[[matrix.include]]\nworkload = ["m:b"]\ninput_shape = [[16]]\n')
    suite = load_suite(str(path))
    assert [c.workload for c in suite.expand()] == ["m:a", "m:b"]
    narrowed = suite.with_overrides(["input_shape=3,8,8"]).expand()  # one shape, written with commas
    assert [(c.workload, c.input_shape) for c in narrowed] == [("m:a", (3, 8, 8))]
    swept = suite.with_overrides(["input_shape=3x8x8,16"]).expand()  # two shapes
    assert [(c.workload, c.input_shape) for c in swept] == [("m:a", (3, 8, 8)), ("m:a", (16,)), ("m:b", (16,))]


def test_a_loss_function_with_a_builtin_workload_is_unsupported():
    from gpubench.backends import get_backend
    from gpubench.config import Config

    reason = get_backend("torch").unsupported(Config(workload="mlp", loss="lossm:my_loss"))
    assert reason == ("loss = lossm:my_loss: a loss function of your own applies to your own model or a zoo's; "
                      "mlp is a built-in workload, trained with cross_entropy")


# --- language models and models that compute their own loss ------------------------------------------

CORPUS = REPO / "tests" / "corpus"
GPT = {"workload": "gpt:gpt", "input_shape": (64,)}


def _gpt_flops(t: int = 64, d: int = 64, vocab: int = 256, layers: int = 2) -> int:
    """tests/corpus/gpt.py's forward FLOPs per sample: each block's qkv, projection and MLP and
    attention's two products (causal or not, the kernels compute the whole square), then the head."""
    block = 2 * t * d * 3 * d + 2 * t * d * d + 2 * 2 * t * d * 4 * d + 2 * 2 * t * t * d
    return layers * block + 2 * t * d * vocab


def test_a_gpt_as_nanogpt_writes_it_trains_on_tokens_with_its_own_loss(monkeypatch):
    """A GPT that returns (logits, loss) given targets and the last position's logits without
    (nanoGPT's forward), on fused attention: its first layer, an embedding, makes it a token
    model (said in its notes); loss_output = 1 trains the loss it computes, the targets passed
    after the inputs; its FLOPs count attention whatever kernel runs."""
    from gpubench.backends.pytorch.native import native_model
    from gpubench.config import Config

    monkeypatch.syspath_prepend(str(CORPUS))
    native = native_model(Config(**GPT, loss_output="1"))
    facts = native.facts
    assert (facts["task"], facts["num_classes"], facts["input_shape"]) == ("tokens", 256, [64])
    assert facts["notes"][0].startswith("input_kind = auto: the model's first layer is an embedding "
                                        "(Embedding(256, 64))")
    assert facts["forward_flops_per_sample"] == _gpt_flops() and facts["flops_per_sample"] == 3 * _gpt_flops()
    pool = native.make_batches(4, 1)
    (tokens, targets), y = pool.x, pool.y
    assert tokens.dtype == np.int64 and tokens.shape[1:] == (4, 64) and np.array_equal(targets, y)
    assert np.array_equal(tokens[:, :, 1:], y[:, :, :-1])  # the next-token task: targets shifted by one
    loss = native.loss(native.build()(*map(torch_tensor, (tokens[0], targets[0]))), None).detach()
    assert loss.shape == () and abs(float(loss) - np.log(256)) < 0.5  # about uniform at the start


def test_attention_is_counted_whatever_kernel_computes_it(monkeypatch):
    """The same GPT with fused attention (on the CPU, a flash kernel the counter has no formula
    for) and with its two products written out: the same FLOPs, so an A/B of the two compares
    TFLOP/s as it compares speed."""
    from gpubench.backends.pytorch.native import native_model
    from gpubench.config import Config

    monkeypatch.syspath_prepend(str(CORPUS))
    for attention in ("sdpa", "manual"):
        native = native_model(Config(**GPT, loss_output="1", workload_params=(("attention", attention),)))
        assert native.facts["flops_per_sample"] == 3 * _gpt_flops(), attention


def torch_tensor(a):
    import torch

    return torch.from_numpy(a)


LOSSES = """
import torch

def per_sample(outputs, targets):
    return torch.nn.functional.cross_entropy(outputs[0][:, -1], targets[:, -1], reduction="none")  # one a sample

def not_finite(outputs, targets):
    return outputs[0].sum() * float("nan")
"""


@pytest.mark.parametrize("settings, message", [
    ({}, "the model's scores [2, 1, 256] do not fit the targets [2, 64] (cross_entropy takes (batch, classes) for "
         "(batch,), or (batch, time, vocabulary) for (batch, time)); it returned tuple (Tensor [2, 1, 256], NoneType);"
         ' use a batch function whose targets fit the output (batches = "module:function"), the loss the model '
         'computes (loss_output = "<field>"'),
    ({"loss_output": "2"}, "loss_output = '2': the model's output has no position 2 holding a loss; it returned "
                           "tuple (Tensor [2, 64, 256], Tensor [])"),
    ({"loss_output": "loss"}, "loss_output = 'loss': the model's output has no field 'loss' holding a loss"),
    ({"loss_output": "1", "loss": "lossfns:per_sample"}, "the model's own loss or yours, not both"),
    ({"loss": "lossfns:per_sample"}, "loss 'lossfns:per_sample': gave an array of shape [2] for a batch of 2; a "
                                     "loss is one number"),
    ({"loss": "lossfns:not_finite"}, "loss 'lossfns:not_finite': gave nan for a batch of 2 at the initial weights"),
    ({"input_shape": (4, 64)}, "input_kind = tokens takes input_shape = [T], a sequence's length; got [4, 64]"),
    ({"input_kind": "features"}, "the model does not take input_shape [64] (batch first): RuntimeError: Expected "
                                 "tensor for argument #1 'indices'"),
])
def test_a_language_model_that_cannot_train_is_one_line(tmp_path, monkeypatch, settings, message):
    from gpubench.config import Config
    from gpubench.runner.models import check_here

    (tmp_path / "lossfns.py").write_text(LOSSES)
    monkeypatch.syspath_prepend(str(CORPUS))
    monkeypatch.syspath_prepend(str(tmp_path))
    config = Config(**{**GPT, "input_kind": "tokens" if "input_shape" in settings else "auto", **settings})
    problem = check_here([config.to_dict()])
    assert problem is not None and problem.startswith("workload 'gpt:gpt': ") and message in problem, problem


ODD_MODELS = """
import numpy as np
import torch
from torch import nn


class Conditioned(nn.Module):  # an embedding made first, for a condition, and float features in
    def __init__(self):
        super().__init__()
        self.cond = nn.Embedding(10, 16)
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc(x) + self.cond.weight[0, :4]


class OwnLossClassifier(nn.Module):  # token ids in, a class per sequence, its loss from the targets
    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(100, 32), nn.Linear(32, 4)

    def forward(self, x, y):
        logits = self.head(self.embed(x).mean(dim=1))
        return logits, nn.functional.cross_entropy(logits, y)


class Upsampler(nn.Module):  # a bilinear upsampling, which is no matrix work
    def __init__(self):
        super().__init__()
        self.conv, self.head = nn.Conv2d(3, 4, 3, padding=1), nn.Linear(4 * 16 * 16, 5)

    def forward(self, x):
        up = nn.functional.interpolate(self.conv(x), scale_factor=2, mode="bilinear")
        return self.head(nn.functional.avg_pool2d(up, 2).flatten(1))


def conditioned():
    return Conditioned()


def own_loss_classifier():
    return OwnLossClassifier()


def upsampler():
    return Upsampler()


def soft_labels(batch_size):  # class probabilities as targets: torch's cross-entropy takes them
    rng = np.random.default_rng(batch_size)
    p = rng.random((batch_size, 10)).astype(np.float32)
    return rng.standard_normal((batch_size, 16)).astype(np.float32), p / p.sum(axis=1, keepdims=True)


def with_dict(batch_size):
    return soft_labels(batch_size)[0], {"probs": soft_labels(batch_size)[1]}


def linear():
    return nn.Linear(16, 10)


def pair_loss(outputs, targets):
    return outputs.sum(), {"logs": 1}
"""


@pytest.mark.parametrize("settings, expected", [
    # an embedding first that takes no token ids: features, as before input_kind
    (dict(workload="odd:conditioned", input_shape=(16,), num_classes=4), ("classes", None)),
    # a model of token ids whose forward wants the targets: probed with them, a class per sequence
    (dict(workload="odd:own_loss_classifier", input_shape=(16,), num_classes=4, loss_output="1"),
     ("sequences", None)),
    # a batch function's targets the framework's loss takes (class probabilities) are not refused
    (dict(workload="odd:linear", batches="odd:soft_labels"), (None, None)),
    # bilinear upsampling leaves the count whole
    (dict(workload="odd:upsampler", input_shape=(3, 16, 16), num_classes=5), ("classes", None)),
    # a loss that gives a pair, not a number
    (dict(workload="odd:linear", batches="odd:soft_labels", loss="odd:pair_loss"),
     (None, "loss 'odd:pair_loss': gave tuple (Tensor [], dict {logs: int}); a loss is one number")),
    # the framework's loss on targets it cannot take: what failed, and the choices
    (dict(workload="odd:linear", batches="odd:with_dict"),
     (None, "cross_entropy failed on the scores [2, 10] and the targets of the batch function")),
])
def test_models_of_other_shapes_meet_their_tasks(tmp_path, monkeypatch, settings, expected):
    from gpubench.backends.pytorch.native import native_model
    from gpubench.config import Config
    from gpubench.workloads.source import SourceError

    (tmp_path / "odd.py").write_text(ODD_MODELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "odd", raising=False)
    task, message = expected
    if message:
        with pytest.raises(SourceError, match=re.escape(message)):
            native_model(Config(**settings))
        return
    facts = native_model(Config(**settings)).facts
    assert facts.get("task") == task and facts["flops_per_sample"] > 0, facts


def test_tokens_for_a_model_that_takes_no_integers_is_one_line(monkeypatch):
    from gpubench.config import Config
    from gpubench.runner.models import check_here

    monkeypatch.syspath_prepend(str(EXAMPLE))
    config = Config(workload="mymodels:small_convnet", input_kind="tokens", input_shape=(16,), num_classes=10)
    problem = check_here([config.to_dict()])
    assert problem is not None and "the model does not take integer token batches of shape [2, 16] (input_kind = " \
        "tokens): RuntimeError" in problem, problem


def test_a_user_loss_applies_in_every_framework_that_declares_it():
    """The declared capability: a factory's config with the user's loss is supported by each
    framework (a built-in workload's is not: it trains with cross_entropy)."""
    from gpubench.backends import get_backend
    from gpubench.config import Config

    for name in ("torch", "tensorflow", "jax"):
        config = Config(workload="m:f", framework=name, loss="m:my_loss")
        assert get_backend(name).unsupported(config) is None, name


# --- what gpubench counts ------------------------------------------------------------------------

def _small_convnet(width: int):
    from torch import nn

    return nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.GroupNorm(4, width), nn.SiLU(),
                         nn.Conv2d(width, width, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(width, 10))


def test_flops_of_a_user_model_are_pytorchs_count_of_the_training_step():
    from gpubench.backends.pytorch.native import count_train_flops, cross_entropy, one_batch
    from gpubench.workloads.data import SyntheticTask

    facts = count_train_flops(_small_convnet(8), one_batch(SyntheticTask((3, 8, 8), 10), 2, 0), cross_entropy)
    conv1, conv2, linear = 2 * 3 * 9 * 8 * 64, 2 * 8 * 9 * 8 * 64, 2 * 8 * 10
    # the first convolution has no input gradient (its input is the data); the others have both
    assert facts["forward_flops_per_sample"] == conv1 + conv2 + linear
    assert facts["flops_per_sample"] == 2 * conv1 + 3 * conv2 + 3 * linear


def test_grouped_convolution_backward_is_counted_with_its_groups():
    from torch import nn

    from gpubench.backends.pytorch.native import count_train_flops, one_batch
    from gpubench.workloads.data import SyntheticTask

    depthwise = nn.Sequential(nn.Conv2d(16, 16, 3, groups=16, padding=1), nn.Flatten())
    facts = count_train_flops(depthwise, one_batch(SyntheticTask((16, 8, 8), 10), 2, 0), lambda out, y: out.sum())
    forward = 2 * 16 * 64 * 9  # per sample: each output element is 9 MACs of its own channel
    assert facts["forward_flops_per_sample"] == forward
    assert facts["flops_per_sample"] == 2 * forward  # + the weight gradient; FlopCounterMode alone says 17x


@pytest.mark.parametrize("workload", ["mlp", "cnn"])
def test_the_count_of_a_builtin_equals_its_spec(workload):
    from gpubench.backends.pytorch.model import build_model
    from gpubench.backends.pytorch.native import count_train_flops, cross_entropy, one_batch
    from gpubench.workloads import get_workload
    from gpubench.workloads.data import SyntheticTask

    spec = get_workload(workload).spec()
    facts = count_train_flops(build_model(spec), one_batch(SyntheticTask(spec.input_shape, spec.num_classes), 2, 0),
                              cross_entropy)
    assert facts["flops_per_sample"] == spec.train_flops_per_sample
    assert facts["forward_flops_per_sample"] == spec.forward_flops_per_sample


def test_structured_batches_keep_their_structure():
    sys.path.insert(0, str(EXAMPLE))
    try:
        from mymodels import tagger_batches
    finally:
        sys.path.remove(str(EXAMPLE))
    from gpubench.workloads.data import function_batches

    pool = function_batches(tagger_batches, 4, 6, "batches")
    assert set(pool.x) == {"tokens", "extra"} and pool.x["tokens"].shape == (6, 4, 12)
    assert pool.n_batches == 6 and pool.batch_size == 4 and pool.structured
    shard = pool.shard(1, 2)
    assert np.array_equal(shard.x["extra"], pool.x["extra"][1::2]) and np.array_equal(shard.y, pool.y[1::2])
    merged = pool.merge(2)
    assert merged.x["tokens"].shape == (3, 8, 12) and merged.y.shape == (3, 8)
    with pytest.raises(ValueError, match="expected \\(inputs, targets\\)"):
        function_batches(lambda b: np.zeros(b), 4, 1, "batches 'm:f'")


# --- the whole tool, on real models ------------------------------------------------------------------

OWN_SUITE = f"""
name = "own"
[defaults]
{fast_lines()}
[matrix]
workload = ["mymodels:small_convnet"]
precision = ["fp32"]
input_shape = [[3, 16, 16]]
[[matrix.include]]
workload = ["mymodels:tagger"]
batches = ["mymodels:tagger_batches"]
loss = ["mymodels:my_loss"]
checkpointing = ["none", "activations"]
precision = ["fp32"]
input_shape = [[12]]
[[matrix.include]]
workload = ["mymodels:small_convnet"]
parallelism = ["pipeline:2"]
precision = ["fp32"]
input_shape = [[3, 16, 16]]
[[matrix.include]]
workload = ["mymodels:small_convnet"]
parallelism = ["ddp:2"]
precision = ["fp32"]
input_shape = [[3, 16, 16]]
[[matrix.include]]
workload = ["mymodels:keras_convnet"]
framework = ["tensorflow"]
precision = ["amp-bf16"]
input_shape = [[32, 32, 3]]
[[matrix.include]]
workload = ["mymodels:keras_convnet"]
framework = ["tensorflow"]
parallelism = ["mirrored:2"]
precision = ["fp32"]
input_shape = [[32, 32, 3]]
[[matrix.include]]
workload = ["more_models:keras_unbuilt"]
framework = ["tensorflow"]
precision = ["fp32"]
input_shape = [[20]]
num_classes = [10]
loss = ["more_models:keras_loss"]
"""

MORE_MODELS = """
import keras


def keras_unbuilt():
    # no Input: Keras makes the weights on the first call
    return keras.Sequential([keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)])


def keras_loss(outputs, targets):
    return keras.ops.mean(keras.losses.sparse_categorical_crossentropy(targets, outputs, from_logits=True))
"""


@pytest.mark.slow
def test_run_trains_the_users_own_models(project):
    pytest.importorskip("tensorflow")
    (project / "own.toml").write_text(OWN_SUITE)
    (project / "more_models.py").write_text(MORE_MODELS)
    proc = run_cli(["run", "own.toml", "--out", "runs", "--no-calibrate"], cwd=project, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = (project / "runs").iterdir()
    results = {r["config_id"]: r for r in map(json.loads, (run_dir / "results.jsonl").read_text().splitlines())}
    by = {(r["config"]["workload"], r["config"]["precision"], r["config"]["parallelism"], r["config"]["checkpointing"],
           r["config"]["framework"]): r for r in results.values()}
    conv = by[("mymodels:small_convnet", "fp32", "single", "none", "torch")]
    assert conv["status"] == "ok" and conv["metrics"]["throughput"]["median"] > 0
    model = conv["model"]
    # small_convnet(width=16) at 16x16: PyTorch's own count of the training step
    convs = 2 * 3 * 9 * 16 * 256 * 2 + 2 * 16 * 9 * 16 * 256 * 3
    assert model["source"] == "factory" and model["identical"] is False
    assert model["flops_per_sample"] == convs + 3 * 2 * 16 * 10 and model["params"] == 3002
    assert model["origin"]["file"] == str((project / "mymodels.py").resolve())
    assert len(model["origin"]["file_sha1"]) == 40
    tagger = by[("mymodels:tagger", "fp32", "single", "none", "torch")]  # trained with the user's loss
    assert tagger["status"] == "ok" and tagger["config"]["loss"] == "mymodels:my_loss", tagger.get("reason")
    # its LSTM has no formula in PyTorch's counter: no FLOPs, no MFU, said why (never a count without it)
    assert tagger["model"]["flops_per_sample"] is None and "mkldnn_rnn_layer" in tagger["model"]["flops_note"]
    assert "no MFU for mymodels:tagger: no count: FlopCounterMode has no formula" in " ".join(proc.stdout.split())
    # settings that cannot apply to a user's model are unsupported, with the reason
    checkpointed = by[("mymodels:tagger", "fp32", "single", "activations", "torch")]
    assert checkpointed["status"] == "unsupported" and "torch.nn.Sequential" in checkpointed["reason"]
    piped = by[("mymodels:small_convnet", "fp32", "pipeline:2", "none", "torch")]
    assert piped["status"] == "unsupported" and "built-in workload's layers" in piped["reason"]
    # the same model under DDP (gradient accumulation wraps any model as it does a built-in one:
    # test_parallel's)
    ddp = by[("mymodels:small_convnet", "fp32", "ddp:2", "none", "torch")]
    assert ddp["status"] == "ok", ddp.get("reason")
    assert ddp["model"]["flops_per_sample"] == conv["model"]["flops_per_sample"]
    mixed = by[("mymodels:keras_convnet", "amp-bf16", "single", "none", "tensorflow")]
    assert mixed["status"] == "ok" and mixed["runtime"]["mixed_precision_policy"] == "mixed_bfloat16"
    mirrored = by[("mymodels:keras_convnet", "fp32", "mirrored:2", "none", "tensorflow")]
    assert mirrored["status"] == "ok", mirrored.get("reason")
    unbuilt = by[("more_models:keras_unbuilt", "fp32", "single", "none", "tensorflow")]  # with the user's loss
    assert unbuilt["status"] == "ok" and unbuilt["config"]["loss"] == "more_models:keras_loss", unbuilt.get("reason")
    assert unbuilt["model"]["params"] == 20 * 32 + 32 + 32 * 10 + 10  # trainable weights, once built
    keras_model = mirrored["model"]  # the model's facts, whatever the parallelism and precision
    assert keras_model["input_shape"] == [32, 32, 3] and keras_model["num_classes"] == 10
    assert keras_model["flops_per_sample"] > 0 and "TensorFlow" in keras_model["flops_counted_by"]
    assert mixed["model"]["flops_per_sample"] == keras_model["flops_per_sample"]
    # each model counted once in the run (its precisions, parallel kinds and repeats read the count):
    # small_convnet and tagger in PyTorch, keras_convnet and keras_unbuilt in TensorFlow
    assert len(list((run_dir / ".work" / "model-flops").glob("flops-*.json"))) == 4
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["args"]["code_path"] == [str(project.resolve())]
    report = project / "reports" / run_dir.name / "index.html"
    assert report.is_file() and "mymodels.small_convnet" in report.read_text()


ZOO_SUITE = f"""
name = "zoo"
[defaults]
{fast_lines()}
num_classes = 10
[matrix]
workload = ["timm:test_vit"]
[[matrix.include]]
workload = ["torchvision:mobilenet_v3_small"]
input_shape = [[3, 32, 32]]
[[matrix.include]]
workload = ["hf:gpt2"]
"args.n_layer" = [1]
"args.n_embd" = [32]
"args.n_head" = [2]
input_shape = [[16]]
[[matrix.include]]
workload = ["keras:MobileNetV3Small"]
framework = ["tensorflow"]
input_shape = [[32, 32, 3]]
"""

@pytest.mark.slow
def test_run_trains_zoo_models_by_name(tmp_path):
    requires("torchvision", "timm", "transformers", "tensorflow")
    (tmp_path / "zoo.toml").write_text(ZOO_SUITE)
    proc = run_cli(["run", "zoo.toml", "--out", "runs", "--no-calibrate"], cwd=tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    report = (tmp_path / "reports" / run_dir.name / "index.html").read_text()
    assert all(name in report for name in ("hf.gpt2", "timm.test_vit", "torchvision.mobilenet_v3_small",
                                           "keras.MobileNetV3Small"))
    results = {r["config"]["workload"]: r for r in map(json.loads, (run_dir / "results.jsonl").read_text().splitlines())}
    assert sorted(results) == ["hf:gpt2", "keras:MobileNetV3Small", "timm:test_vit", "torchvision:mobilenet_v3_small"]
    for workload, r in results.items():
        assert r["status"] == "ok", (workload, r.get("reason"))
        assert r["model"]["flops_per_sample"] > 0 and r["model"]["params"] > 0
        assert r["model"]["source"] == workload.split(":")[0] and r["model"]["model_name"] == workload.split(":")[1]
    gpt = results["hf:gpt2"]["model"]
    assert gpt["task"] == "tokens" and gpt["input_shape"] == [16] and gpt["num_classes"] == 50257
    assert results["timm:test_vit"]["model"]["input_shape"] == [3, 160, 160]  # the model's own default
    mobilenet = results["torchvision:mobilenet_v3_small"]["model"]
    # where torchvision's compiled operators do not load beside this torch (PyPI's torchvision is
    # built for PyPI's CUDA torch; the tests install the CPU build), its models still train, and
    # the result says so
    plain = subprocess.run([sys.executable, "-c", "import torchvision"], capture_output=True, text=True)
    if plain.returncode != 0:
        assert "operator torchvision::nms does not exist" in plain.stderr, plain.stderr[-500:]
        (note,) = mobilenet["notes"]
        assert note.startswith("torchvision's compiled operators did not load beside torch ") and "unavailable" in note
    else:
        assert "notes" not in mobilenet
    # timm and Transformers import torchvision but use none of it: no note of it on their models
    for workload in ("timm:test_vit", "hf:gpt2"):
        assert not [n for n in results[workload]["model"].get("notes", []) if "torchvision" in n], workload
    # a depthwise network trains at about 3x its forward FLOPs (2x for the first layer), not 35x
    assert 2 * mobilenet["forward_flops_per_sample"] < mobilenet["flops_per_sample"] < 3 * mobilenet[
        "forward_flops_per_sample"]
    # (a language model's profile is the corpus': tests/test_corpus.py; each framework's profiler is
    # test_profile's; the gate on a model that imports nothing of the user's is the fake backend's)


BAD_MODELS = [
    ("nosuch:make", "", "workload 'nosuch:make': no module named 'nosuch' (looked in the suite's directory"),
    ("mymodels:small_convnett", "", "module mymodels has no 'small_convnett'; did you mean: small_convnet"),
    ("badmodels:not_a_model", "", "the factory returned int, not a torch.nn.Module (framework = torch)"),
    ("badmodels:broken", "", "importing badmodels failed: ZeroDivisionError: division by zero"),
    ("mymodels:small_convnet", "args.depth = 2", "cannot be called with args.depth: got an unexpected keyword"),
    ("mymodels:small_convnet", "num_classes = 10\ninput_shape = [16, 16, 3]",
     "the model does not take input_shape [16, 16, 3] (batch first): RuntimeError: Given groups=1"),
    ("mymodels:small_convnet", "num_classes = 7", "the model gives 10 scores per sample; num_classes = 7"),
    ("hf:gpt2", "args.n_layers = 2\ninput_shape = [8]", "args.n_layers: gpt2's config has no field 'n_layers'; "
                                                           "nearest: n_layer"),
    ("hf:gpt2", "args.n_layer = -1\ninput_shape = [8]", "args.n_layer = -1: gpt2's n_layer is a count, at least 1 "
                                                        "(its default: 12)"),
    ("torchvision:resnet5", "", "torchvision has no model 'resnet5'; nearest: resnet50"),
    ("hf:gtp2", "", "Transformers has no model type 'gtp2'; nearest: gpt2"),
]


def _bad_suite(project, workload: str, extra: str):
    (project / "badmodels.py").write_text("def not_a_model():\n    return 42\n" if "broken" not in workload
                                          else "1 / 0\n")
    shape = "" if "input_shape" in extra else "input_shape = [3, 16, 16]"
    if "num_classes" not in extra and workload.startswith("mymodels"):
        extra += "\nnum_classes = 10"
    (project / "bad.toml").write_text(f'[defaults]\nworkload = "{workload}"\n{shape}\n{extra}\n')


@pytest.mark.parametrize("workload, extra, message", [BAD_MODELS[0], BAD_MODELS[2]])
def test_a_model_that_cannot_be_built_is_one_line_before_anything_runs(project, workload, extra, message):
    _bad_suite(project, workload, extra)
    proc = run_cli(["run", "bad.toml", "--out", "runs"], cwd=project, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("gpubench: error: bad.toml: ") and message in line, line
    assert "Traceback" not in proc.stderr and not (project / "runs").exists()


@pytest.mark.parametrize("workload, extra, message", BAD_MODELS)
def test_each_model_problem_has_its_line(project, monkeypatch, workload, extra, message):
    """What the check child says for each problem (the same code, in this process)."""
    if workload.startswith("hf:"):
        requires("transformers")
    if workload.startswith("torchvision:"):
        requires("torchvision")
    from gpubench.runner.models import check_here
    from gpubench.suite import load_suite

    _bad_suite(project, workload, extra)
    monkeypatch.syspath_prepend(str(project))
    for name in ("mymodels", "badmodels"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    (config,) = load_suite(str(project / "bad.toml")).expand()
    problem = check_here([config.to_dict()])
    assert problem is not None and problem.startswith(f"workload {workload!r}: ") and message in problem, problem


def test_a_zoo_whose_package_is_missing_is_unavailable_with_its_pip_line(monkeypatch):
    from gpubench.backends import backend_class
    from gpubench.config import Config
    from gpubench.runner.sweep import pre_resolve
    from gpubench.workloads.source import ZOOS, Zoo

    # a zoo registered as plugins register one, whose package this machine lacks
    monkeypatch.setitem(ZOOS, "absent", Zoo("absent", "gpubench_absent_zoo", "pip install absent-zoo"))
    torch_backend = backend_class("torch")  # whose models it makes: a backend's zoos
    monkeypatch.setattr(torch_backend, "zoos", (*torch_backend.zoos, "absent"))
    status, reason = pre_resolve(Config(workload="absent:net", input_shape=(3, 8, 8)), {})
    assert status == "unavailable"
    assert reason == "absent: models need the gpubench_absent_zoo package; install with: pip install absent-zoo"
    assert pre_resolve(Config(workload="mymodels:net", input_shape=(3, 8, 8)), {}) is None  # a factory: imported


# the example project's tests of the pytest fixture (run with the corpus': tests/test_corpus.py)
FIXTURE_TEST = """
import pytest

SMALL = dict(batch_size=4, threads=1, steps_per_round=2, rounds=3, warmup_rounds=1)


def test_step(gpubench_benchmark):
    step = gpubench_benchmark(workload="mymodels:small_convnet", input_shape=(3, 16, 16), num_classes=10,
                              args={"width": 8}, **SMALL)
    assert step.throughput > 0 and step.model["flops_per_sample"] > 0
    assert step.config.config_id == "mymodels.small_convnet_width8-torch-cpu-bs4-fp32-single-threads=1"


# (every zoo's models are built by the same code in a worker: test_run_trains_zoo_models_by_name;
# here, in pytest's one process, a model with a batch function, a zoo's language model, and Keras
# beside PyTorch)
@pytest.mark.parametrize("settings", [
    dict(workload="mymodels:tagger", batches="mymodels:tagger_batches"),
    dict(workload="hf:gpt2", args={"n_layer": 1, "n_embd": 32, "n_head": 2}, input_shape=(16,)),
    dict(workload="mymodels:keras_convnet", framework="tensorflow"),
], ids=lambda s: s["workload"])
def test_zoo_and_own(gpubench_benchmark, settings):
    step = gpubench_benchmark(**settings, **SMALL)
    assert step.throughput > 0 and step.loss() == step.loss() and step.model["params"] > 0
    print("FLOPS", settings["workload"], step.model["flops_per_sample"])


def test_bad(gpubench_benchmark):
    gpubench_benchmark(workload="mymodels:nope", input_shape=(3, 16, 16))
"""


@pytest.mark.slow
def test_python_api_returns_the_reports_table(project, monkeypatch):
    from gpubench.api import benchmark

    monkeypatch.chdir(project)
    table = benchmark("mymodels:small_convnet", input_shape=(3, 16, 16), num_classes=10, args={"width": [8, 16]},
                      out=project / "api-runs", **FAST)
    assert list(table["config_id"]) == ["mymodels.small_convnet_width8-torch-cpu-bs4-fp32-single-threads=1",
                                        "mymodels.small_convnet_width16-torch-cpu-bs4-fp32-single-threads=1"]
    assert list(table["status"]) == ["ok", "ok"] and (table["throughput"] > 0).all()
    assert table["flops_per_sample"].iloc[1] > table["flops_per_sample"].iloc[0]


# --- the gate on the user's code -----------------------------------------------------------------------

def _ab_of_a_slower_change(tmp_path) -> subprocess.CompletedProcess:
    base, head = tmp_path / "base", tmp_path / "head"
    shutil.copytree(EXAMPLE, base)
    shutil.copytree(EXAMPLE, head)
    # the pull request's change: the features computed three times over
    code = (head / "mymodels.py").read_text()
    slow = code.replace("            x = self.features(x)\n",
                        "            x = self.features(x) + 0.0 * self.features(x) + 0.0 * self.features(x)\n")
    assert slow != code
    (head / "mymodels.py").write_text(slow)
    # lockstep, as docs/ci.md recommends for a gate: the two sides take turns window by window,
    # so drift of a shared CI machine lands on both (6 unpaired repeats once called the same code
    # "improved" there); the fewest rounds that decide at alpha 0.2 (a step three times the
    # features' work is no close call: the statistics are test_gate's and test_lockstep's)
    return run_cli(["ab", "head/suite.toml", "--baseline-path", "base", "--candidate-path", "head", "--lockstep",
                    "--repeats", "4", "--alpha", "0.2", "--set", "precision=fp32", "--set", "steps=4", "--set", "windows=2", "--set", "warmup_steps=1",
                    "--out", "runs", "--no-report", "--json", "gate.json"], cwd=tmp_path, timeout=900)


@pytest.mark.slow
def test_ab_gates_a_change_of_the_users_model_code(tmp_path):
    """The pull request's change makes the user's model slower: regressed, exit 1, and the triage
    names the model file. (The same code on both sides, in real PyTorch workers, is the A/A of
    test_bisect's continued measurement; the triage of the same file is test_gate's.)"""
    proc = _ab_of_a_slower_change(tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    verdicts = {v["config_id"]: v["verdict"] for v in json.loads((tmp_path / "gate.json").read_text())["verdicts"]}
    assert list(verdicts.values()) == ["regressed"]
    # the triage names the change: the model file differs between the checkouts
    assert re.search(r"model code: mymodels\.small_convnet differs: \S+/base/mymodels\.py", proc.stdout)
    # each side imported the model from its own checkout, and says which file it was
    (root,) = (tmp_path / "runs").iterdir()
    for side, checkout in (("baseline", "base"), ("candidate", "head")):
        first = json.loads((root / side / "results.jsonl").read_text().splitlines()[0])
        assert first["model"]["origin"]["file"] == str((tmp_path / checkout / "mymodels.py").resolve())
        meta = json.loads((root / side / "run.json").read_text())
        assert meta["args"]["code_path"][0] == str((tmp_path / checkout).resolve())


def test_a_models_flops_are_counted_once_a_run(tmp_path):
    """counted_once: the first worker counts and keeps the count in the run's directory, the
    others of the same model and code read it; another file (SHA-1), another setting that
    reaches the model or another framework version counts again; a damaged file is counted over;
    without a directory (the pytest fixture, the model check) it always counts."""
    from gpubench.config import Config
    from gpubench.workloads.source import counted_once

    calls: list[int] = []

    def count() -> dict:
        calls.append(1)
        return {"flops_per_sample": 1000 + len(calls), "flops_counted_by": "test"}

    config = Config(workload="mymodels:net", input_shape=(3, 8, 8))
    facts = {"origin": {"file_sha1": "a" * 40}}
    runs = tmp_path / "model-flops"
    first = counted_once(runs, config, facts, "2.13.0", count)
    # another batch size, precision or device: the same model, not counted again
    again = counted_once(runs, Config(workload="mymodels:net", input_shape=(3, 8, 8), batch_size=64,
                                      precision="amp-bf16"), facts, "2.13.0", count)
    assert first == again == {"flops_per_sample": 1001, "flops_counted_by": "test"} and len(calls) == 1
    assert counted_once(runs, config, {"origin": {"file_sha1": "b" * 40}}, "2.13.0", count)["flops_per_sample"] == 1002
    assert counted_once(runs, Config(workload="mymodels:net", input_shape=(3, 16, 16)), facts, "2.13.0",
                        count)["flops_per_sample"] == 1003
    assert counted_once(runs, config, facts, "2.14.1", count)["flops_per_sample"] == 1004
    (kept,) = [p for p in runs.iterdir() if "1001" in p.read_text()]
    kept.write_text("{not json")
    assert counted_once(runs, config, facts, "2.13.0", count)["flops_per_sample"] == 1005
    assert counted_once(None, config, facts, "2.13.0", count)["flops_per_sample"] == 1006 and len(calls) == 6


def test_the_example_suite_is_valid():
    from gpubench.suite import load_suite

    configs = load_suite(str(EXAMPLE / "suite.toml")).expand()
    assert [c.workload for c in configs] == ["mymodels:small_convnet"] * 2
    assert tomllib.loads((EXAMPLE / "suite.toml").read_text())["defaults"]["args"] == {"width": 16}
    assert re.search(r"gpubench ab head/suite\.toml", (EXAMPLE / ".github" / "workflows" / "speed.yml").read_text())


@pytest.mark.parametrize("framework, workload, compiled", [
    ("torch", "mymodels:small_convnet", "torch-compile"),
    ("tensorflow", "mymodels:keras_convnet", "xla"),
])
def test_a_users_model_compiles_as_a_builtin_does(monkeypatch, framework, workload, compiled):
    """torch.compile (Inductor on the CPU) and XLA take the user's model through the same path as
    a built-in: the same SGD steps give the uncompiled losses."""
    pytest.importorskip(framework)
    from gpubench.backends import get_backend
    from gpubench.suite import Config

    monkeypatch.syspath_prepend(str(EXAMPLE))
    shape = (3, 16, 16) if framework == "torch" else (32, 32, 3)
    base = Config(workload=workload, framework=framework, batch_size=8, optimizer="sgd", lr=0.05, input_shape=shape,
                  num_classes=10)
    backend = get_backend(framework)

    def losses(config):
        native = backend.native(config)
        trainer = backend.build(native, config, native.make_batches(config.batch, 1))
        out = []
        for _ in range(5):
            trainer.step()
            out.append(trainer.read_loss())
        return np.array(out), trainer

    plain, _ = losses(base)
    fast, trainer = losses(Config(**{**base.to_dict(), "compile": compiled}))
    np.testing.assert_allclose(fast, plain, rtol=1e-4)
    assert plain[-1] < plain[0]
    assert trainer.describe()["compile"]["setting"] == compiled


HOSTILE_FACTORIES = """
import os, subprocess, sys, time
import torch

sys.stdout.write("loading the models...")  # no newline, at import


def _net():
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 10))


def exits():
    sys.exit(7)


def dies():
    os._exit(3)


def hangs():
    time.sleep(600)


def spawns():
    subprocess.Popen(["sleep", "317"])  # holds the check's stdout, were it a pipe
    return _net()
"""


@pytest.mark.slow  # three checks of a torch factory in a child (10-20 s each)
@pytest.mark.parametrize("factory, message", [
    ("dies", "checking the torch models failed: the check ended with exit code 3 while building workload 'facs:dies'"),
    ("hangs", "checking the torch models: building workload 'facs:hangs' took longer than 20 s (the configs' "
              "timeout_s); stopped"),
    ("spawns", None),
])
def test_the_model_check_survives_what_a_factory_does(tmp_path, factory, message):
    """A factory module that writes to stdout without a newline (each of these), a factory that
    ends the process, hangs or starts a background process: the pre-run check answers on a
    channel of its own, within the configs' timeout_s, names the workload and the exit code,
    and kills what the factory left running (a sys.exit is named in the check itself: below)."""
    (tmp_path / "facs.py").write_text(HOSTILE_FACTORIES)
    (tmp_path / "s.toml").write_text(f'[defaults]\nworkload = "facs:{factory}"\nframework = "torch"\n'
                                     'input_shape = [1, 4, 4]\nnum_classes = 10\nbatch_size = 4\nsteps = 2\n'
                                     'windows = 1\nwarmup_steps = 1\ntimeout_s = 20\n')
    t0 = time.monotonic()
    proc = run_cli(["run", "s.toml", "--out", "runs", "--no-report", "--no-calibrate"], cwd=tmp_path, timeout=120)
    took = time.monotonic() - t0
    assert "Traceback" not in proc.stderr, proc.stderr
    if message is None:  # the check passed, the config trained
        assert proc.returncode == 0, proc.stdout + proc.stderr
        (run_dir,) = (tmp_path / "runs").iterdir()
        assert [r["status"] for r in result_lines(run_dir)] == ["ok"]
    else:
        assert proc.returncode == 2 and message in proc.stderr.strip().splitlines()[-1], proc.stderr
        assert not (tmp_path / "runs").exists()
    # never the old fixed 600 s, nor the background sleep's 317 (timeout_s leaves a worker that
    # imports torch room on a CI machine at half speed)
    assert took < 120
    if factory == "spawns":  # nothing it started outlives the check or the config's worker
        import psutil

        assert not [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "317"]]


def test_a_factory_that_calls_sys_exit_is_named_with_its_code(tmp_path, monkeypatch):
    from gpubench.config import Config
    from gpubench.runner.models import check_here

    (tmp_path / "facs.py").write_text(HOSTILE_FACTORIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "facs", raising=False)
    config = Config(workload="facs:exits", framework="torch", input_shape=(1, 4, 4), num_classes=10)
    assert check_here([config.to_dict()]) == "workload 'facs:exits': called sys.exit(7) while it was built"

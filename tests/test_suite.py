"""Suite loading, every validation error, matrix expansion, include/exclude and --set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpubench.errors import InputError
from gpubench.suite import Config, load_suite, parse_suite

BASE = """
name = "t"
[matrix]
workload = ["cnn", "mlp"]
device = ["cpu", "cuda"]
precision = ["fp32", "amp-bf16"]
batch_size = [32, 128]
"""


def ids(configs):
    return [c.config_id for c in configs]


def test_expansion_is_the_product_in_a_stable_order(write_suite):
    configs = load_suite(str(write_suite(BASE))).expand()
    assert len(configs) == 16
    assert configs[0].config_id == "cnn-torch-cpu-bs32-fp32-single"
    assert configs[1].config_id == "cnn-torch-cpu-bs128-fp32-single"
    assert configs[-1].config_id == "mlp_depth2_width512-torch-cuda-bs128-amp-bf16-single"
    assert len(set(ids(configs))) == 16
    assert ids(configs) == ids(load_suite(str(write_suite(BASE))).expand())


def test_config_is_frozen_hashable_and_round_trips():
    c = Config(workload="mlp", batch_size=8, workload_params=(("depth", 3), ("width", 16)))
    with pytest.raises(AttributeError):
        c.batch_size = 9  # type: ignore[misc]
    assert hash(c) == hash(Config.from_dict(c.to_dict()))
    assert Config.from_dict(c.to_dict()) == c
    assert c.config_id == "mlp_depth3_width16-torch-cpu-bs8-fp32-single"


def test_config_id_names_non_default_training_settings_but_not_measurement_settings():
    base = Config(workload="cnn")
    assert Config(workload="cnn", optimizer="sgd", lr=0.01).config_id == base.config_id + "-optimizer=sgd-lr=0.01"
    assert Config(workload="cnn", threads=1).config_id == base.config_id + "-threads=1"
    more_steps = Config(workload="cnn", steps=99)
    assert more_steps.config_id == base.config_id
    assert more_steps.config_hash != base.config_hash


def test_defaults_apply_and_matrix_overrides_them(write_suite):
    text = """
[defaults]
workload = "mlp"
steps = 7
batch_size = 4
optimizer = "sgd"
[matrix]
batch_size = [8, 16]
"""
    configs = load_suite(str(write_suite(text))).expand()
    assert [c.batch_size for c in configs] == [8, 16]
    assert all(c.steps == 7 and c.optimizer == "sgd" and c.workload == "mlp" for c in configs)


def test_exclude_removes_matching_points(write_suite):
    text = BASE + """
[[matrix.exclude]]
device = "cpu"
batch_size = 128
[[matrix.exclude]]
workload = "mlp"
precision = ["amp-bf16"]
"""
    configs = load_suite(str(write_suite(text))).expand()
    assert not any(c.device == "cpu" and c.batch_size == 128 for c in configs)
    assert not any(c.workload == "mlp" and c.precision == "amp-bf16" for c in configs)
    # 16 - 4 (cpu,128) - 4 (mlp,bf16) + 1 (counted twice: mlp, cpu, 128, bf16)
    assert len(configs) == 9


def test_include_adds_points_and_free_axes_range_over_the_matrix(write_suite):
    text = BASE + """
[[matrix.include]]
device = "cuda"
precision = ["tf32", "amp-fp16"]
batch_size = 512
"""
    configs = load_suite(str(write_suite(text))).expand()
    added = [c for c in configs if c.batch_size == 512]
    assert sorted((c.workload, c.precision) for c in added) == [
        ("cnn", "amp-fp16"), ("cnn", "tf32"), ("mlp", "amp-fp16"), ("mlp", "tf32")]
    assert all(c.device == "cuda" for c in added)
    assert len(configs) == 20


def test_include_can_re_add_an_excluded_point_and_duplicates_are_dropped(write_suite):
    text = BASE + """
[[matrix.exclude]]
device = "cuda"
[[matrix.include]]
workload = "cnn"
device = "cuda"
precision = "fp32"
batch_size = 32
[[matrix.include]]
workload = "cnn"
device = "cpu"
precision = "fp32"
batch_size = 32
"""
    configs = load_suite(str(write_suite(text))).expand()
    assert len(configs) == 9  # 8 cpu points + the one cuda point; the cpu include duplicates one
    assert ids(configs).count("cnn-torch-cpu-bs32-fp32-single") == 1
    assert "cnn-torch-cuda-bs32-fp32-single" in ids(configs)


def test_workload_parameters_apply_only_to_workloads_that_take_them(write_suite):
    text = """
[matrix]
workload = ["cnn", "mlp"]
depth = [10, 50]
width = 256
"""
    configs = load_suite(str(write_suite(text))).expand()
    assert ids(configs) == [
        "cnn-torch-cpu-bs64-fp32-single",
        "mlp_depth10_width256-torch-cpu-bs64-fp32-single",
        "mlp_depth50_width256-torch-cpu-bs64-fp32-single",
    ]


def test_device_aliases_are_normalised(write_suite):
    text = '[matrix]\nworkload = "cnn"\ndevice = ["gpu", "gpu:1", "cuda:0", "cpu"]\n'
    assert [c.device for c in load_suite(str(write_suite(text))).expand()] == ["cuda", "cuda:1", "cuda:0", "cpu"]


def test_bare_suite_name_resolves_under_suites(tmp_path, monkeypatch):
    (tmp_path / "suites").mkdir()
    (tmp_path / "suites" / "mine.toml").write_text('[defaults]\nworkload = "cnn"\n')
    monkeypatch.chdir(tmp_path)
    suite = load_suite("mine")
    assert suite.name == "mine" and len(suite.expand()) == 1


def test_repo_quick_suite_is_valid():
    from pathlib import Path

    suite = load_suite(str(Path(__file__).resolve().parent.parent / "suites" / "quick.toml"))
    configs = suite.expand()
    assert {c.workload for c in configs} == {"cnn", "mlp"}
    assert {c.device for c in configs} == {"cpu", "cuda"}
    assert {c.precision for c in configs} == {"fp32", "amp-bf16"}
    assert len({c.batch_size for c in configs}) == 2
    assert {c.framework for c in configs} == {"torch", "tensorflow", "jax"}


SUITES_DIR = Path(__file__).resolve().parent.parent / "suites"


@pytest.mark.parametrize("path", sorted(SUITES_DIR.glob("*.toml")), ids=lambda p: p.stem)
def test_every_shipped_suite_loads_and_no_config_is_statically_unsupported_by_mistake(path):
    """A shipped suite expands, and none of its configs is refused by a framework's static rules
    unless the suite means it (TensorFlow's checkpointed configs in the resnet suite)."""
    from gpubench.backends import get_backend

    configs = load_suite(str(path)).expand()
    assert configs
    refused = [(c.config_id, r) for c in configs if (r := get_backend(c.framework).unsupported(c))]
    expected = [(cid, r) for cid, r in refused if path.stem == "resnet" and "checkpointing" in cid]
    assert refused == expected


def test_the_gpu_suites_sweep_what_issue_8_names():
    gpu = load_suite(str(SUITES_DIR / "gpu.toml")).expand()
    assert {c.workload for c in gpu} == {"cnn", "mlp", "resnet18", "resnet50"}
    assert {c.framework for c in gpu} == {"torch", "tensorflow"}
    assert {c.precision for c in gpu} == {"fp32", "tf32", "amp-fp16", "amp-bf16"}
    assert {c.compile for c in gpu} == {"none", "torch-compile", "cuda-graph", "xla"}
    assert {c.device for c in gpu} == {"cuda"}
    assert len({c.batch_size for c in gpu if c.workload == "cnn"}) >= 3
    targets = {c.config_id for c in load_suite(str(SUITES_DIR / "gpu-targets.toml")).expand()}
    assert "resnet50-torch-cuda-bs256-amp-bf16-single-memory_format=channels-last" in targets
    assert "resnet50-torch-cuda-bs256-tf32-single-memory_format=channels-last" in targets
    assert "cnn-torch-cuda-bs1024-amp-bf16-single" in targets
    assert "cnn-torch-cuda-bs128-fp32-single-compile=cuda-graph" in targets


# --- every validation error: one line naming file, key and allowed values -----------------

@pytest.mark.parametrize("text, expected", [
    ("name = 'x'\n[matrix]\nworkload = ['cnn']\nprecision = ['fp17']",
     "matrix.precision: unknown precision 'fp17'; expected one of: fp32, tf32, amp-fp16, amp-bf16"),
    ("[matrix]\nworkload = ['resnet9']", "matrix.workload: unknown workload 'resnet9' (did you mean resnet50?); expected one of: cnn, gpt, mlp"),
    ("[matrix]\nworkload = 'cnn'\nframework = 'mxnet'", "matrix.framework: unknown framework 'mxnet'; expected one of:"),
    ("[matrix]\nworkload = 'cnn'\ndevice = 'tpu'", "matrix.device: unknown device 'tpu'; expected one of: cpu, cuda, cuda:N"),
    ("[matrix]\nworkload = 'cnn'\ndevice = 'cpu:1'", "matrix.device: unknown device 'cpu:1'"),
    ("[matrix]\nworkload = 'cnn'\nbatch_size = [0]", "matrix.batch_size: must be 1..2147483647 or \"max\", got 0"),
    ("[matrix]\nworkload = 'cnn'\nbatch_size = [-4]", "matrix.batch_size: must be 1..2147483647 or \"max\", got -4"),
    ("[matrix]\nworkload = 'cnn'\nbatch_size = ['big']", "matrix.batch_size: expected an integer >= 1 or \"max\", got 'big'"),
    ("[matrix]\nworkload = 'cnn'\nbatch_size = [true]", "matrix.batch_size: expected an integer >= 1 or \"max\", got True"),
    ("[matrix]\nworkload = 'cnn'\nbatch_size = []", "matrix.batch_size: empty list"),
    ("[matrix]\nworkload = 'cnn'\nparallelism = 'pipeline:x'", "matrix.parallelism: unknown parallelism 'pipeline:x'; expected one of: single, grad-accum:N, ddp:N"),
    ("[matrix]\nworkload = 'cnn'\npipeline_schedule = 'zb'", "matrix.pipeline_schedule: unknown pipeline schedule 'zb'; expected one of: gpipe, 1f1b"),
    ("[matrix]\nworkload = 'cnn'\noptimizer = 'lion'", "matrix.optimizer: unknown optimizer 'lion'; expected one of: adam, adamw, sgd"),
    ("[matrix]\nworkload = 'cnn'\nlr = 0", "matrix.lr: must be > 0, got 0"),
    ("[matrix]\nworkload = 'cnn'\nbatchsize = 3", "matrix.batchsize: unknown key 'batchsize' (did you mean batch_size?); expected one of: workload,"),
    ("[defaults]\nworkload = 'cnn'\nsteps = 0", "defaults.steps: must be >= 1, got 0"),
    ("[defaults]\nworkload = 'cnn'\nwarmup_steps = -1", "defaults.warmup_steps: must be >= 0, got -1"),
    ("[defaults]\nworkload = 'cnn'\ntimeout_s = -5", "defaults.timeout_s: must be > 0, got -5"),
    ("[defaults]\nworkload = 'cnn'\ntimeout_s = inf", "defaults.timeout_s: must be finite, got inf"),
    ("[matrix]\nworkload = 'cnn'\nbatch_size = [99999999999999999999]",
     "matrix.batch_size: must be 1..2147483647 or \"max\", got 99999999999999999999"),
    ("[defaults]\nworkload = 'cnn'\nseed = 18446744073709551616", "defaults.seed: must be <= 4294967295, got"),
    ("[defaults]\nworkload = 'cnn'\nsteps = 4294967296", "defaults.steps: must be <= 2147483647, got 4294967296"),
    ("[defaults]\ndepth = 1\n[matrix]\nbatch_size = [8]", "missing key 'workload' (set it in [matrix] or [defaults])"),
    ("[defaults]\nworkload = ['cnn']", "defaults.workload: expected a single value (sweep lists belong in [matrix])"),
    ("[defaults]\nwarmup = 3\nworkload = 'cnn'", "defaults.warmup: unknown key 'warmup'"),
    ("[matrix]\nworkload = 'mlp'\ndepth = [0]", "matrix.depth: must be >= 1, got 0"),
    ("[matrix]\nworkload = 'cnn'\ndepth = [10]", "depth: no workload in this suite takes 'depth' (cnn takes: none)"),
    ("[matrix]\nworkload = 'vit'\nheads = [3]", "vit: heads 3 do not divide d_model 128"),
    ("[matrix]\nworkload = 'vit'\npatch = [5]", "vit: patch 5 does not divide image 32"),
    ("[matrix]\nbatch_size = [8]", "missing key 'workload' (set it in [matrix] or [defaults]); expected one of: cnn, gpt, mlp"),
    ("[matrix]\nworkload = 'cnn'\ninclude = {device = 'cpu'}", "matrix.include: expected a list of tables"),
    ("[matrix]\nworkload = 'cnn'\n[[matrix.exclude]]\n", "matrix.exclude[0]: empty entry"),
    ("[matrix]\nworkload = 'cnn'\n[[matrix.include]]\nprecision = 'fp8'",
     "matrix.include[0].precision: unknown precision 'fp8'"),
    ("[matrix]\nworkload = 'cnn'\n[[matrix.exclude]]\nworkload = 'cnn'", "the matrix is empty after include/exclude"),
    ("title = 'x'\n[matrix]\nworkload = 'cnn'",
     "unknown top-level key 'title'; expected one of: name, description, defaults, matrix"),
    ("name = 'has space'\n[matrix]\nworkload = 'cnn'", "name: expected letters, digits"),
    ("matrix = 3", "matrix: expected a table [matrix]"),
])
def test_validation_errors_name_file_key_and_allowed_values(write_suite, text, expected):
    path = write_suite(text)
    with pytest.raises(InputError) as err:
        load_suite(str(path))
    message = str(err.value)
    assert message.startswith(str(path) + ": "), message
    assert expected in message
    assert "\n" not in message


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(InputError, match=r"nope\.toml: no such suite file"):
        load_suite(str(tmp_path / "nope.toml"))
    bad = tmp_path / "bad.toml"
    bad.write_text("[matrix\nworkload = 'cnn'")
    with pytest.raises(InputError, match=r"bad\.toml: invalid TOML"):
        load_suite(str(bad))


# --- --set --------------------------------------------------------------------------------

def test_set_replaces_an_axis_and_sets_defaults(write_suite):
    suite = load_suite(str(write_suite(BASE))).with_overrides(["batch_size=64", "steps=3", "device=cpu"])
    configs = suite.expand()
    assert {c.batch_size for c in configs} == {64}
    assert {c.device for c in configs} == {"cpu"}
    assert all(c.steps == 3 for c in configs)
    assert len(configs) == 4


def test_set_with_several_values_makes_a_new_axis(write_suite):
    suite = load_suite(str(write_suite(BASE))).with_overrides(["lr=0.1,0.01", "workload=mlp", "device=cpu",
                                                                 "precision=fp32", "batch_size=32"])
    assert ids(suite.expand()) == ["mlp_depth2_width512-torch-cpu-bs32-fp32-single-lr=0.1",
                                   "mlp_depth2_width512-torch-cpu-bs32-fp32-single-lr=0.01"]


def test_set_narrows_include_entries(write_suite):
    text = BASE + """
[[matrix.include]]
device = "cuda"
precision = "tf32"
batch_size = [512, 1024]
"""
    suite = load_suite(str(write_suite(text)))
    assert any(c.precision == "tf32" for c in suite.expand())
    cpu_only = suite.with_overrides(["device=cpu"]).expand()
    assert {c.device for c in cpu_only} == {"cpu"}
    big = suite.with_overrides(["batch_size=512"]).expand()
    assert {c.batch_size for c in big} == {512}  # the axis is replaced and the include narrowed
    assert {(c.device, c.batch_size) for c in big if c.precision == "tf32"} == {("cuda", 512)}
    assert len(big) == 8 + 2


@pytest.mark.parametrize("item, expected", [
    ("batch_size", "--set batch_size: expected KEY=VALUE[,VALUE...]"),
    ("=3", "--set =3: expected KEY=VALUE"),
    ("batchsize=3", "--set batchsize=3: unknown key 'batchsize' (did you mean batch_size?); expected one of: workload, framework"),
    ("batch_size=abc", "--set batch_size=abc: expected an integer >= 1 or \"max\", got 'abc'"),
    ("batch_size=0", "--set batch_size=0: must be 1..2147483647 or \"max\", got 0"),
    ("precision=fp17", "--set precision=fp17: unknown precision 'fp17'; expected one of: fp32, tf32"),
    ("device=npu", "--set device=npu: unknown device 'npu'"),
])
def test_set_errors(write_suite, item, expected):
    suite = load_suite(str(write_suite(BASE)))
    with pytest.raises(InputError) as err:
        suite.with_overrides([item])
    assert expected in str(err.value)


def test_suite_round_trips_through_run_json(write_suite):
    suite = load_suite(str(write_suite(BASE + "[[matrix.exclude]]\ndevice = 'cuda'\n"))).with_overrides(["steps=2"])

    from gpubench.suite import Suite

    again = Suite.from_dict(json.loads(json.dumps(suite.to_dict())))
    assert again.expand() == suite.expand()


def test_parse_suite_from_dict_defaults_the_name():
    suite = parse_suite({"matrix": {"workload": ["cnn"]}}, "inline.toml", default_name="inline")
    assert suite.name == "inline"


def test_set_of_a_parameter_no_workload_takes_is_refused(write_suite):
    cnn_only = load_suite(str(write_suite("[matrix]\nworkload = ['cnn']\n")))
    with pytest.raises(InputError) as err:
        cnn_only.with_overrides(["depth=3"])
    assert str(err.value) == "--set depth=3: no workload in this suite takes 'depth' (cnn takes: none)"
    # narrowing the workloads of a suite whose defaults hold another workload's parameters is fine
    both = load_suite(str(write_suite("[defaults]\ndepth = 3\n[matrix]\nworkload = ['cnn', 'mlp']\n")))
    narrowed = both.with_overrides(["workload=cnn"])
    assert [c.workload for c in narrowed.expand()] == ["cnn"]
    from gpubench.suite import Suite

    # and such a run resumes: its stored suite is checked as a suite, not for parameter typos
    assert Suite.from_dict(json.loads(json.dumps(narrowed.to_dict()))).expand() == narrowed.expand()


@pytest.mark.parametrize("edit, expected", [
    (lambda d: d["matrix"].update(workload=["llama"]), "run.json: suite: matrix.workload: unknown workload 'llama'"),
    (lambda d: d["defaults"].update(steps="many"), "run.json: suite: defaults.steps: expected an integer >= 1, got 'many'"),
    (lambda d: d.pop("name"), "run.json: suite: name: expected letters"),
    (lambda d: d.update(matrix=[1]), "run.json: suite: matrix: expected a table"),
    (lambda d: d.update(overrides={"precision": ["fp8"]}), "run.json: suite.overrides.precision: unknown precision"),
])
def test_a_stored_suite_is_checked_again(write_suite, edit, expected):
    from gpubench.suite import Suite

    d = load_suite(str(write_suite(BASE + "[defaults]\nsteps = 2\n"))).to_dict()
    edit(d)
    with pytest.raises(InputError) as err:
        Suite.from_dict(d)
    assert str(err.value).startswith(expected), str(err.value)
    with pytest.raises(InputError, match="run.json: suite: expected an object, got list"):
        Suite.from_dict([d])


# --- an optimizer's settings --------------------------------------------------------------

def test_an_optimizers_settings_apply_where_it_takes_them_and_name_the_config(write_suite):
    text = """
name = "t"
[defaults]
momentum = 0.5
beta2 = 0.95
[matrix]
workload = "mlp"
optimizer = ["adam", "adamw", "sgd"]
weight_decay = [0.01, 0.1]
"""
    configs = load_suite(str(write_suite(text))).expand()
    # weight_decay is adamw's only: adam and sgd make one point each, not two
    assert ids(configs) == [
        "mlp_depth2_width512-torch-cpu-bs64-fp32-single-beta2=0.95",
        "mlp_depth2_width512-torch-cpu-bs64-fp32-single-optimizer=adamw-beta2=0.95-weight_decay=0.01",
        "mlp_depth2_width512-torch-cpu-bs64-fp32-single-optimizer=adamw-beta2=0.95-weight_decay=0.1",
        "mlp_depth2_width512-torch-cpu-bs64-fp32-single-optimizer=sgd-momentum=0.5",
    ]
    adam, adamw, _, sgd = configs
    assert adam.optimizer_settings() == {"beta1": 0.9, "beta2": 0.95, "eps": 1e-8}
    assert adamw.optimizer_settings() == {"beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.01}
    assert sgd.optimizer_settings() == {"momentum": 0.5} and sgd.beta2 is None
    # unset, every setting keeps the hash results were recorded under
    assert Config(workload="cnn", optimizer="sgd", momentum=None).config_hash == \
        Config(workload="cnn", optimizer="sgd").config_hash
    assert Config(workload="cnn", optimizer="sgd", momentum=0.9).config_hash != \
        Config(workload="cnn", optimizer="sgd").config_hash


@pytest.mark.parametrize("text, expected", [
    ("beta2 = 1.0", "defaults.beta2: must be >= 0 and < 1, got 1.0"),
    ("momentum = -0.1", "defaults.momentum: must be >= 0 and < 1, got -0.1"),
    ("eps = 0", "defaults.eps: must be > 0, got 0"),
    ("weight_decay = 'lots'", "defaults.weight_decay: expected a number >= 0, got 'lots'"),
])
def test_bad_optimizer_settings_name_the_key(write_suite, text, expected):
    with pytest.raises(InputError) as err:
        load_suite(str(write_suite(f'name = "t"\n[defaults]\nworkload = "mlp"\n{text}\n')))
    assert expected in str(err.value)

"""Backends declare the settings they support; configs are checked against the declaration."""

from __future__ import annotations

import pytest

from gpubench.backends import BACKENDS, backend_class, declared_values, get_backend
from gpubench.backends.base import Backend
from gpubench.config import BACKEND_CHECKED, Config
from gpubench.errors import InputError
from gpubench.options import Capabilities
from gpubench.suite import parse_suite

CAPS = Capabilities(precisions={"cpu": ("fp32",), "cuda": ("fp32", "amp-bf16")}, parallelism=("single", "ddp"),
                    compile=("none", "xla"), notes={"compile=cuda-graph": "no graphs here"})


@pytest.mark.parametrize("settings, expected", [
    ({}, None),
    ({"device": "cuda", "precision": "amp-bf16", "parallelism": "ddp:4"}, None),
    ({"precision": "amp-bf16"}, "x does not support precision = amp-bf16 on cpu; it supports: fp32"),
    ({"parallelism": "grad-accum:2"}, "x does not support parallelism = grad-accum:2; it supports: single, ddp:N"),
    ({"compile": "cuda-graph"}, "x does not support compile = cuda-graph; it supports: none, xla, best (no graphs here)"),
    ({"data": "pipeline"}, "x does not support data = pipeline; it supports: device"),
    ({"checkpointing": "activations"}, "x does not support checkpointing = activations; it supports: none"),
    ({"memory_format": "channels-last"}, "x does not support memory_format = channels-last; it supports: contiguous"),
])
def test_a_config_is_checked_against_what_its_backend_declares(settings, expected):
    assert CAPS.problem("x", Config(workload="mlp", **settings), BACKEND_CHECKED) == expected


def test_declared_values_are_the_union_of_every_backend_in_the_built_in_order():
    assert declared_values("compile") == ["none", "xla", "torch-compile", "torch-compile-reduce-overhead",
                                          "torch-compile-max-autotune", "cuda-graph", "best"]
    assert declared_values("precision") == ["fp32", "tf32", "amp-fp16", "amp-bf16"]
    assert backend_class("torch").capabilities.values("precision") == ("fp32", "amp-bf16", "tf32", "amp-fp16")


class _JitBackend(Backend):
    """A plugin's framework with a compile mode of its own."""

    name = "jitfw"
    install_hint = "nothing to install"
    capabilities = Capabilities(precisions={"cpu": ("fp32",)}, parallelism=("single",), compile=("none", "my-jit"))

    def static_unsupported(self, config): return None
    def probe(self): raise NotImplementedError
    def check(self, config): return None
    def build(self, spec, config, batches): raise NotImplementedError
    def is_oom(self, exc): return False


@pytest.fixture
def jit_backend(monkeypatch):
    monkeypatch.setitem(BACKENDS, "jitfw", f"{__name__}:_JitBackend")


def test_a_value_only_a_plugin_declares_is_accepted_and_every_other_framework_refuses_it(jit_backend):
    suite = parse_suite({"defaults": {"workload": "mlp", "compile": "my-jit"},
                         "matrix": {"framework": ["torch", "tensorflow", "jitfw"]}}, "s.toml")
    reasons = {c.framework: get_backend(c.framework).unsupported(c) for c in suite.expand()}
    # before backends declared their options, PyTorch ran an unknown compile value eagerly
    assert reasons["torch"].startswith("torch does not support compile = my-jit; it supports: none, torch-compile")
    assert reasons["tensorflow"].startswith("tensorflow does not support compile = my-jit; it supports: none, xla, best")
    assert reasons["jitfw"] is None


def test_a_value_no_backend_declares_is_a_suite_error_naming_the_allowed_values():
    with pytest.raises(InputError) as e:
        parse_suite({"defaults": {"workload": "mlp", "compile": "my-jit"}}, "s.toml")
    assert str(e.value) == ("s.toml: defaults.compile: unknown compile 'my-jit'; expected one of: none, xla, "
                            "torch-compile, torch-compile-reduce-overhead, torch-compile-max-autotune, cuda-graph, best")


def test_a_backend_without_a_declaration_fails_when_it_is_made():
    class Undeclared(Backend):
        name = "undeclared"
        install_hint = "-"

        def static_unsupported(self, config): return None
        def probe(self): raise NotImplementedError
        def check(self, config): return None
        def build(self, spec, config, batches): raise NotImplementedError
        def is_oom(self, exc): return False

    with pytest.raises(TypeError, match="backend Undeclared must set: capabilities"):
        Undeclared()


def test_the_torch_step_builder_refuses_a_compile_value_it_does_not_know():
    pytest.importorskip("torch")
    from gpubench.backends.pytorch.compile import compile_model

    with pytest.raises(ValueError, match="unknown compile setting 'my-jit' for torch"):
        compile_model(None, Config(workload="mlp", compile="my-jit"))


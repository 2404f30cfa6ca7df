"""A config's model as a ``torch.nn.Module``, whatever its source: a built-in spec, the user's
factory (``module:function``), or a zoo's model by name (torchvision, timm, Hugging Face).

For a model that is not a built-in, the model is built once on the host here, before the
trainer: its output tells the classes of the synthetic task where the suite gives none, and
``torch.utils.flop_counter.FlopCounterMode`` counts one training step's FLOPs (forward, loss,
backward) at batch 2, halved: PyTorch's own count, from the operators the model really runs.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from gpubench.backends.base import NativeModel, Tree, spec_native
from gpubench.backends.pytorch.checkpointing import KeepBuffers, checkpointed
from gpubench.config import Config
from gpubench.workloads import WORKLOADS
from gpubench.workloads.base import WorkloadSpec
from gpubench.workloads.data import Batches, SyntheticTask, one_batch, tree_leaves, tree_map
from gpubench.workloads.dataset import builtin_spec
from gpubench.workloads.source import (
    CHOICES,
    FIRST_BATCH,
    ModelRef,
    SourceError,
    check_arguments,
    check_first_batch,
    code_origin,
    config_loss,
    counted_once,
    import_function,
    input_problem,
    nearest,
    own_batches,
    parse_workload,
    probe_scores,
    recomputed_once,
    token_task,
)

FLOP_COUNT_BATCH = FIRST_BATCH  # the first batch's samples (own_batches), counted and checked
DEFAULT_IMAGE = (3, 224, 224)
DEFAULT_TOKENS = 128  # a language model's sequence length where the suite gives none (at most its context)
Tensors = Tree[torch.Tensor]
# (a builder of the model, the synthetic task it trains on (classes unknown: 0), facts)
Source = tuple[Callable[[], nn.Module], SyntheticTask | None, dict[str, Any]]


def call_model(model: Callable[..., object], x: Tensors) -> object:
    """The model on a batch as it takes it: one tensor, several (a tuple), or keywords (a dict)."""
    if isinstance(x, dict):
        return model(**x)
    if isinstance(x, (tuple, list)):
        return model(*x)
    return model(x)


def logits_of(out: object) -> torch.Tensor:
    """The scores in a model's output: a tensor, a Hugging Face output's ``logits``, a dict's
    ``"logits"``, or the first element of a tuple (torchvision's auxiliary outputs)."""
    if isinstance(out, torch.Tensor):
        return out
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(out, dict) and isinstance(out.get("logits"), torch.Tensor):
        return out["logits"]
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise TypeError(f"the model returned {type(out).__name__}, which holds no logits tensor; name a loss function "
                    "(loss = \"module:function\") that takes this output")


def cross_entropy(out: object, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the logits against class targets: (N, C) vs (N,), or a sequence's
    (N, T, V) vs (N, T), its positions flattened. In float32 (autocast's rule for the loss)."""
    logits = logits_of(out)
    if logits.dim() == y.dim() + 1 and logits.dim() > 2:
        logits = logits.reshape(-1, logits.shape[-1])
        y = y.reshape(-1)
    return nn.functional.cross_entropy(logits.float(), y)


def native_model(config: Config, counts: Path | None = None, count: bool = True) -> NativeModel:
    """The config's model, its data and its facts; ``counts``: where the run keeps the FLOP counts
    of its models, so that a model is counted once a run (``counted_once``; none with ``count``
    False)."""
    ref = parse_workload(config.workload, sorted(WORKLOADS))
    if ref.kind == "builtin":
        native = _builtin(builtin_spec(config), config)
        if count and config.checkpointing == "activations":
            _count_recomputed(native, config, counts, native.make_batches(FLOP_COUNT_BATCH, 1))
        return native
    stubbed = torchvision_without_its_operators()  # before the factory's or zoo's imports, which may import it
    build, task, facts = _source(ref, config)
    notes: list[str] = []
    loss = config_loss(config)
    batch_fn = import_function(config.batches, "batches") if config.batches else None
    probe = build()
    if not isinstance(probe, nn.Module):
        raise SourceError(f"workload {config.workload!r}: the factory returned {type(probe).__name__}, not a "
                          "torch.nn.Module (framework = torch)")
    facts["params"] = sum(p.numel() for p in probe.parameters())
    if stubbed and any(type(m).__module__.startswith("torchvision.") for m in probe.modules()):
        notes.append(stubbed)  # a torchvision model ran without its operators: say so (a zoo that only imports it: no)
    synthetic = batch_fn is None and config.dataset == "synthetic"
    if synthetic:
        task = _task(task, probe, config, notes, ref.kind == "factory")
        facts.update(input_shape=list(task.input_shape), num_classes=task.num_classes, task=task.kind)
    data: dict[str, Any] = {}
    make, sample, held_out = own_batches(task, batch_fn, config, facts, data)
    _check_first_batch(probe, sample, loss, config, task if synthetic else None)
    if notes:
        facts["notes"] = notes
    if count and int(os.environ.get("RANK", "0")) == 0:  # the result's facts are rank 0's: the other ranks skip it
        facts.update(counted_once(counts, config, facts, torch.__version__,
                                  partial(count_train_flops, probe, sample, loss or cross_entropy)))
    sequential = isinstance(probe, nn.Sequential)
    del probe
    native = NativeModel(build=build, make_batches=make, facts=facts, loss=loss, sequential=sequential,
                         eval_batches=held_out, data=data)
    if count and sequential:
        _count_recomputed(native, config, counts, sample)
    return native


def _count_recomputed(native: NativeModel, config: Config, counts: Path | None, sample: Batches) -> None:
    """``recomputed_flops_per_sample`` (recomputed_once): FlopCounterMode over a training step of
    the checkpointed model less one of the plain model, the forward the backward pass computes
    again, as far as torch.utils.checkpoint recomputes (it stops once the tensors the backward
    needs are back)."""

    def count() -> dict[str, Any]:
        model = native.build()
        loss = native.loss or cross_entropy
        plain = count_train_flops(model, sample, loss).get("flops_per_sample")
        again = count_train_flops(checkpointed(model), sample, loss).get("flops_per_sample")
        return {"recomputed_flops_per_sample": again - plain if plain and again and again >= plain else None}
    recomputed_once(counts, config, native.facts, torch.__version__, count)


_STUBS: list[torch.library.Library] = []  # the Library holding the stand-in schemas: deleting it would undefine them


def torchvision_without_its_operators() -> str | None:
    """Let torchvision import where its compiled operators do not load: PyPI's torchvision is built
    against PyPI's CUDA build of torch and does not load beside a CPU build (nor beside any other
    torch than its own). Its models need none of those operators (detection's nms, roi_align, ...),
    but its import registers two of them (nms, qnms) by name and fails where they are not defined
    ("operator torchvision::nms does not exist"). Defined here as schemas without kernels, they let
    the import go on; calling an operator still raises torchvision's own "Couldn't load custom C++
    ops". Returns what was done, for the result's notes, or None where nothing needed doing."""
    if _STUBS or "torchvision" in sys.modules or (spec := importlib.util.find_spec("torchvision")) is None:
        return None
    found = [p for d in spec.submodule_search_locations or () for p in Path(d).glob("_C.*")
             if p.suffix in (".so", ".pyd")]
    if not found:
        return None
    try:
        torch.ops.load_library(str(found[0]))  # what torchvision's import does first
        return None
    except OSError as e:
        why = str(e).splitlines()[0].replace(f"{found[0].parent}{os.sep}", "")[:200]  # the error, not the venv
    lib = torch.library.Library("torchvision", "FRAGMENT")
    for op in ("nms", "qnms"):
        lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _STUBS.append(lib)
    return (f"torchvision's compiled operators did not load beside torch {torch.__version__} ({why}): its models "
            "train without them; its detection operators (nms, roi_align, ...) are unavailable")


def as_native(model: NativeModel | WorkloadSpec, config: Config) -> NativeModel:
    """A built-in spec handed over directly (tests, the overhead benchmark) as its NativeModel."""
    return _builtin(model, config) if isinstance(model, WorkloadSpec) else model


def _builtin(spec: WorkloadSpec, config: Config) -> NativeModel:
    from gpubench.backends.pytorch.model import build_model

    return spec_native(spec, config, lambda: build_model(spec, spec.init_weights(config.init_seed), config.attention))


def _seeded(make: Callable[[], nn.Module], seed: int) -> Callable[[], nn.Module]:
    """``make`` with the torch generator seeded first: every build gives the same weights."""
    def build() -> nn.Module:
        torch.manual_seed(seed)
        return make()
    return build


def _source(ref: ModelRef, config: Config) -> Source:
    kwargs = dict(config.workload_params)
    shape = config.input_shape
    if ref.kind == "factory":
        fn = import_function(config.workload, "workload")
        check_arguments(fn, kwargs, config.workload)
        facts = {"source": "factory", "identical": False, "origin": code_origin(fn)}
        task = SyntheticTask(shape, config.num_classes) if shape else None
        if task is None and not config.batches and config.dataset == "synthetic":
            raise SourceError(f"workload {config.workload!r}: set input_shape (one sample's shape, e.g. [3, 32, 32]), "
                              "a batch function (batches = \"module:function\") or your data set (dataset = "
                              "\"module:function\")")
        return _seeded(lambda: fn(**kwargs), config.init_seed), task, facts
    zoo = {"torchvision": _torchvision, "timm": _timm, "hf": _hf}.get(ref.module)
    if zoo is None:
        raise SourceError(f"workload {config.workload!r}: {ref.module} models train with another framework")
    return zoo(ref, config, kwargs, {"source": ref.module, "identical": False, "model_name": ref.name})


def _classes_kw(config: Config) -> dict[str, Any]:
    return {"num_classes": config.num_classes} if config.num_classes else {}


def _torchvision(ref: ModelRef, config: Config, kwargs: dict[str, Any], facts: dict[str, Any]) -> Source:
    import torchvision

    facts["version"] = torchvision.__version__
    names = torchvision.models.list_models()
    if ref.name not in names:
        raise SourceError(f"workload {ref.text!r}: torchvision has no model {ref.name!r}{nearest(ref.name, names)}")
    kw = {**_classes_kw(config), **kwargs}
    make = lambda: torchvision.models.get_model(ref.name, weights=None, **kw)  # noqa: E731
    task = SyntheticTask(config.input_shape or DEFAULT_IMAGE, config.num_classes)
    return _seeded(make, config.init_seed), task, facts


def _timm(ref: ModelRef, config: Config, kwargs: dict[str, Any], facts: dict[str, Any]) -> Source:
    import timm

    facts["version"] = timm.__version__
    names = timm.list_models()
    if ref.name not in names:
        raise SourceError(f"workload {ref.text!r}: timm has no model {ref.name!r}{nearest(ref.name, names)}")
    kw = {**_classes_kw(config), **kwargs}
    make = lambda: timm.create_model(ref.name, pretrained=False, **kw)  # noqa: E731
    shape = config.input_shape
    if not shape:
        cfg = timm.get_pretrained_cfg(ref.name)
        shape = tuple(getattr(cfg, "input_size", None) or DEFAULT_IMAGE) if cfg is not None else DEFAULT_IMAGE
    return _seeded(make, config.init_seed), SyntheticTask(tuple(shape), config.num_classes), facts


def _a_count(field: str) -> bool:
    """A config field that counts layers or heads (0 of them builds no model worth training)."""
    return any(word in field for word in ("layer", "head"))


def _hf(ref: ModelRef, config: Config, kwargs: dict[str, Any], facts: dict[str, Any]) -> Source:
    import transformers
    from transformers import AutoConfig
    from transformers.models.auto import modeling_auto as auto
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    facts["version"] = transformers.__version__
    names = list(CONFIG_MAPPING.keys())
    if ref.name not in names:
        raise SourceError(f"workload {ref.text!r}: Transformers has no model type {ref.name!r}"
                          f"{nearest(ref.name, names)}")
    defaults = CONFIG_MAPPING[ref.name]()
    unknown = [k for k in kwargs if not hasattr(defaults, k)]
    if unknown:  # Transformers would keep a misspelt field as a new attribute and build the default model
        fields = [k for k in vars(defaults) if not k.startswith("_")]
        raise SourceError(f"workload {ref.text!r}: args.{unknown[0]}: {ref.name}'s config has no field "
                          f"{unknown[0]!r}{nearest(unknown[0], fields)}")
    for k, v in kwargs.items():  # Transformers takes n_layer = -1 and builds a model of no layers
        default = getattr(defaults, k)
        if isinstance(v, int) and not isinstance(v, bool) and isinstance(default, int) and \
                not isinstance(default, bool) and default > 0 and (v < 0 or (v == 0 and _a_count(k))):
            raise SourceError(f"workload {ref.text!r}: args.{k} = {v}: {ref.name}'s {k} is "
                              f"{'a count, at least 1' if _a_count(k) else 'at least 0'} (its default: {default})")
    try:
        cfg = AutoConfig.for_model(ref.name, **kwargs)
    except Exception as e:  # noqa: BLE001 - a bad config argument: say which
        raise SourceError(f"workload {ref.text!r}: its config does not take these args: {e}") from None
    if hasattr(cfg, "use_cache"):
        cfg.use_cache = False  # training: no key/value cache
    kind = type(cfg)
    if kind in auto.MODEL_FOR_CAUSAL_LM_MAPPING or kind in auto.MODEL_FOR_MASKED_LM_MAPPING:
        head = (transformers.AutoModelForCausalLM if kind in auto.MODEL_FOR_CAUSAL_LM_MAPPING
                else transformers.AutoModelForMaskedLM)
        context: int = next((int(getattr(cfg, a)) for a in ("n_positions", "max_position_embeddings")
                             if getattr(cfg, a, None)), DEFAULT_TOKENS)
        seq = config.input_shape[0] if config.input_shape else min(DEFAULT_TOKENS, int(context))
        facts["head"] = head.__name__
        task = SyntheticTask((seq,), int(cfg.vocab_size), kind="tokens")
        return _seeded(lambda: head.from_config(cfg), config.init_seed), task, facts
    if kind in auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING:
        if config.num_classes:
            cfg.num_labels = config.num_classes
        size = getattr(cfg, "image_size", 224)
        size = size if isinstance(size, int) else int(size[0])
        shape = config.input_shape or (int(getattr(cfg, "num_channels", 3)), size, size)
        facts["head"] = "AutoModelForImageClassification"
        make = lambda: transformers.AutoModelForImageClassification.from_config(cfg)  # noqa: E731
        return _seeded(make, config.init_seed), SyntheticTask(tuple(shape), int(cfg.num_labels or 2)), facts
    raise SourceError(f"workload {ref.text!r}: gpubench trains Transformers models with a causal or masked language "
                      f"modelling head or an image classification head; {ref.name} has none of them")


def _task(task: SyntheticTask | None, model: nn.Module, config: Config, notes: list[str],
          factory: bool) -> SyntheticTask:
    """The synthetic task a model trains on without a batch function: a factory's token task
    (``token_task``), else its classes: the suite's, else the size of the model's last output
    dimension, read from a forward pass on two samples of zeros."""
    if factory and task is not None:
        # the first module without children, in the order the model registered its modules
        first = next((m for m in model.modules() if next(m.children(), None) is None), None)
        vocab = first.num_embeddings if isinstance(first, (nn.Embedding, nn.EmbeddingBag)) else None
        on_tokens = None  # the shape of its scores on 2 sequences of token ids (zeros), where it takes them
        shape = tuple(task.input_shape)
        if len(shape) == 1 and config.input_kind != "features" and (vocab or config.input_kind == "tokens"):
            found = _probe(model, config, np.zeros((FLOP_COUNT_BATCH, *shape), np.int64), tokens=True)
            on_tokens = None if isinstance(found, BaseException) else found
        tokens = token_task(config, shape, vocab, repr(first), on_tokens, notes)
        if tokens is not None:
            return tokens
    assert task is not None  # no batch function: the task is known
    if task.num_classes:
        return task
    scores = _probe(model, config, np.zeros((FLOP_COUNT_BATCH, *task.input_shape), np.float32), tokens=False)
    if isinstance(scores, BaseException):
        raise input_problem(config, task, scores) from None
    if scores is None:
        raise SourceError(f"workload {config.workload!r}: the model gives no scores on input_shape "
                          f"{list(task.input_shape)}; set num_classes, or use {CHOICES}")
    return SyntheticTask(task.input_shape, int(scores[-1]), task.kind)


def _probe(model: nn.Module, config: Config, x: np.ndarray, tokens: bool) -> tuple[int, ...] | BaseException | None:
    """``probe_scores`` of the model in eval mode, without gradients, the random state put back."""
    def run(inputs: Tree[np.ndarray]) -> object:
        with torch.no_grad(), torch.random.fork_rng():
            return call_model(model, tree_map(torch.from_numpy, inputs))

    model.eval()
    try:
        return probe_scores(config, x, tokens, run, _scores_of)
    finally:
        model.train()


def _scores_of(out: object) -> tuple[int, ...] | None:
    """The shape of the scores in a model's output (``logits_of``), or None where it holds none."""
    try:
        return tuple(logits_of(out).shape)
    except TypeError:
        return None


def _check_first_batch(model: nn.Module, sample: Batches, loss: Callable[[Any, Any], Any] | None, config: Config,
                       task: SyntheticTask | None) -> None:
    """The model on a batch of 2 of what it trains on, before any config trains: it takes the
    inputs, and its loss (gpubench's cross-entropy, the user's, the model's own) is one finite
    number (on gpubench's data, its scores also fit the task: ``check_first_batch``); else
    SourceError, the pre-run check's one line."""
    x, y = (tree_map(torch.from_numpy, t) for t in sample.sample(FLOP_COUNT_BATCH))
    model.eval()
    try:
        with torch.no_grad(), torch.random.fork_rng():
            check_first_batch(config, task, lambda: call_model(model, x), _scores_of,
                              lambda out: (loss or cross_entropy)(out, y), loss is not None,
                              tuple(y.shape) if isinstance(y, torch.Tensor) else None)
    finally:
        model.train()


def _conv_backward_flops(grad_out_shape: Sequence[int], x_shape: Sequence[int], w_shape: Sequence[int],
                         _bias: object, _stride: object, _padding: object, _dilation: object, transposed: bool,
                         _output_padding: object, _groups: object, output_mask: Sequence[bool],
                         out_shape: object = None) -> int:
    """A convolution's backward FLOPs: each gradient it computes (input, weight) costs what the
    forward convolution does, 2 x output elements x the weight's elements per output channel.
    FlopCounterMode's own formula (torch 2.14) leaves the groups out and so counts a depthwise
    convolution's backward ``channels`` times over (17x its forward in a 16-channel test)."""
    per_output = math.prod(w_shape[1:])
    outputs = math.prod(x_shape) if transposed else math.prod(grad_out_shape)
    forward = 2 * outputs * per_output
    return forward * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


def count_train_flops(model: nn.Module, sample: Batches, loss_fn: Callable[[Any, Any], Any]) -> dict[str, Any]:
    """``flops_per_sample`` of one training step (forward, loss, backward; not the optimizer)
    counted by FlopCounterMode at batch 2, halved; or ``flops_per_sample`` None and why. The
    model's buffers (batch norm statistics) and gradients are put back as they were."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    x, y = (tree_map(torch.from_numpy, t) for t in sample.sample(FLOP_COUNT_BATCH))
    n = int(tree_leaves(x)[0].shape[0])
    counter = FlopCounterMode(display=False, custom_mapping={torch.ops.aten.convolution_backward: _conv_backward_flops})
    seen = _OpsSeen()
    try:
        # attention by its math kernel, two matrix products the counter counts: the fused kernels'
        # count would depend on which one runs (the CPU's flash kernel has no formula in the counter)
        with KeepBuffers([model]), torch.random.fork_rng(), sdpa_kernel(SDPBackend.MATH), counter, seen:
            loss = loss_fn(call_model(model, x), y)
            loss.backward()
    except Exception as e:  # noqa: BLE001 - the count is a measurement aid; the training will say more
        return {"flops_per_sample": None, "flops_note": f"no count: a step on the host failed ({type(e).__name__}: "
                                                        f"{str(e).splitlines()[0] if str(e) else ''})"}
    finally:
        model.zero_grad(set_to_none=True)
    total = int(counter.get_total_flops())
    if total <= 0:
        return {"flops_per_sample": None, "flops_note": "no count: FlopCounterMode saw no matrix multiply or "
                                                        "convolution"}
    out: dict[str, Any] = {"flops_per_sample": total // n if total % n == 0 else math.ceil(total / n),
                           "flops_counted_by": "torch.utils.flop_counter.FlopCounterMode over one training step "
                                               f"(forward, loss, backward) at batch {n}, divided by {n}; attention "
                                               "by its math kernel; convolution backward counted with its groups"}
    uncounted = sorted(str(op) for op in seen.ops - set(counter.flop_registry) if _heavy(op))
    if uncounted:  # a count without them would make MFU silently low: none, and why
        return {"flops_per_sample": None, "flops_uncounted": uncounted,
                "flops_partial_per_sample": out["flops_per_sample"],
                "flops_note": f"no count: FlopCounterMode has no formula for {', '.join(uncounted)} (their FLOPs "
                              "would be left out, and MFU low)"}
    fwd = _forward_flops(model, x)
    if fwd is not None:
        out["forward_flops_per_sample"] = fwd // n
    return out


# the words of the operators that do a model's matrix work (matrix products, convolutions,
# attention, recurrent layers), whole words of their names (aten.mkldnn_rnn_layer: mkldnn, rnn,
# layer; not aten.upsample_bilinear2d's bilinear2d): one the counter has no formula for makes
# the count partial
_HEAVY_WORDS = {"mm", "bmm", "addmm", "addbmm", "baddbmm", "matmul", "einsum", "linear", "conv1d", "conv2d",
                "conv3d", "convolution", "attention", "transformer", "rnn", "lstm", "gru"}


def _heavy(op: object) -> bool:
    """Whether an operator (an overload packet, ``aten.<name>``) does a model's matrix work."""
    return bool(_HEAVY_WORDS.intersection(str(op).rpartition(".")[2].lower().split("_")))


class _OpsSeen(TorchDispatchMode):
    """The operators a block of code ran (their overload packets)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[object] = set()

    def __torch_dispatch__(self, func: torch._ops.OpOverload, types: Sequence[type], args: Sequence[object] = (),
                           kwargs: dict[str, object] | None = None) -> object:
        self.ops.add(getattr(func, "_overloadpacket", func))
        return func(*args, **(kwargs or {}))


def _forward_flops(model: nn.Module, x: Tensors) -> int | None:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    try:
        with KeepBuffers([model]), torch.no_grad(), torch.random.fork_rng(), sdpa_kernel(SDPBackend.MATH), counter:
            call_model(model, x)
    except Exception:  # noqa: BLE001 - the training count stands without it
        return None
    return int(counter.get_total_flops())


__all__ = ["as_native", "call_model", "count_train_flops", "cross_entropy", "logits_of", "native_model", "one_batch"]

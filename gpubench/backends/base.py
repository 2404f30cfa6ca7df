"""The Backend interface every framework implements, and the values it reports.

A backend translates a framework-neutral WorkloadSpec into a Trainer for one Config, and
declares the settings it supports (``capabilities``), which the suite and the runner check
before any process starts. Adding a framework is a package with its Backend and Trainer plus
one ``register_backend`` line.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeAlias, TypeVar, runtime_checkable

# the Trainer interface lives beside the measurement loop; plugins import it from here
from gpubench.config import BACKEND_CHECKED, FUNCTION_CHECKED
from gpubench.measure.trainer import Lap, ProfilingUnavailable, Trainer, no_lap
from gpubench.options import Capabilities

if TYPE_CHECKING:
    from pathlib import Path

    from gpubench.config import Config
    from gpubench.workloads.base import WorkloadSpec
    from gpubench.workloads.data import Batches

__all__ = ["Backend", "Capabilities", "DeviceInfo", "Lap", "NativeModel", "ProbeInfo", "ProfilingUnavailable",
           "Trainer", "Tree", "Unsupported", "no_lap", "spec_native"]

A = TypeVar("A")
# A nested structure of one framework's arrays (``Tree[torch.Tensor]``, ``Tree[np.ndarray]``): an
# array, or a tuple, list or dict (a Flax FrozenDict) of such trees. A batch whose model takes
# several inputs, JAX's parameters and optimizer state (pytrees), Keras' nests.
Tree: TypeAlias = A | Sequence["Tree[A]"] | Mapping[str, "Tree[A]"]


@runtime_checkable
class Evaluating(Protocol):
    """A trainer that evaluates: the mean loss of its model over held-out ``batches``, in
    inference mode and with no update (synchronises; between the timed steps)."""

    def evaluate(self, batches: Batches) -> float: ...


class Unsupported(Exception):
    """Raised while a trainer is built: this setting cannot apply to this model (a user's model
    that is not a plain chain of layers, with ``checkpointing = "activations"``, say). The
    config's status is ``unsupported`` with the message as its reason."""


@dataclass
class NativeModel:
    """A config's model as its framework's own, whatever its source (a built-in spec, the
    user's factory, a zoo), and what training it needs: everything after this (precision,
    compile, parallelism, the loop, results) is written once and does not know the source.

    ``build`` makes the model with its initial weights (called where the trainer needs it: on
    the host, or under a distribution strategy's scope); ``make_batches(batch, group)`` the
    data pool (``group`` micro-batches per optimizer step, as gpubench.workloads.data's
    make_batches); ``loss`` a user's loss function, or None for the built-in cross-entropy;
    ``facts`` the result's ``model`` block (params, flops_per_sample or why none, source,
    identical); ``spec`` a built-in workload's spec (``pipeline:N`` splits its layers);
    ``sequential``: whether the model is a plain chain of top-level layers (activation
    checkpointing cuts it into runs); ``eval_batches(batch)`` held-out batches of the same task
    (a ``target_loss``'s evaluations), None where the source has none yet."""

    build: Callable[[], Any]
    make_batches: Callable[[int, int], Batches]
    facts: dict[str, Any]
    loss: Callable[[Any, Any], Any] | None = None
    spec: WorkloadSpec | None = None
    sequential: bool = False
    # tensorflow: whether the data is in gpubench's channels-first layout (a built-in spec's),
    # to be made channels-last for Keras, or already in the model's own layout
    channels_first_data: bool = False
    eval_batches: Callable[[int], Batches] | None = None
    # a data set's: what its pool and held-out batches hold, as they are made (runtime.dataset)
    data: dict[str, Any] = field(default_factory=dict)


def tensor_split_unsupported(config: Config, n: int) -> str | None:
    """Why tensor parallelism over ``n`` devices cannot split a built-in workload's transformer
    blocks (WorkloadSpec.tensor_split_problem), or None: the one rule of every backend that runs
    tp, checked before a worker starts."""
    from gpubench.workloads import get_workload

    try:
        spec = get_workload(config.workload).spec(**dict(config.workload_params))
    except (KeyError, TypeError, ValueError):  # (bad workload parameters are refused where the spec is built)
        return None
    return spec.tensor_split_problem(n)


def spec_native(spec: WorkloadSpec, config: Config, build: Callable[[], object],
                channels_first_data: bool = False) -> NativeModel:
    """A built-in workload as a NativeModel: ``build`` makes the framework's model of ``spec``;
    the data is gpubench's own for the spec, made for the config (a target's repeat: its own draw
    of the task), the synthetic task's held-out batches another draw of the same task; or a data
    set's epochs (``mnist``, the user's) and its held-out split."""
    from gpubench.workloads.data import eval_batches, make_batches, train_draw
    from gpubench.workloads.dataset import split_pool

    native = NativeModel(build=build, facts=spec.facts(), spec=spec, sequential=True,
                         channels_first_data=channels_first_data,
                         make_batches=lambda batch, group: make_batches(spec, batch, config.seed, group,
                                                                        train_draw(config.trial)),
                         eval_batches=lambda batch: eval_batches(spec, batch, config.seed))
    if config.dataset != "synthetic":
        native.make_batches, native.eval_batches = split_pool(config, native.data)
    return native


@dataclass(frozen=True)
class DeviceInfo:
    name: str  # "cpu", "cuda:0", ...
    model: str  # "AMD EPYC ...", "NVIDIA H100 80GB HBM3"
    memory_bytes: int | None = None


@dataclass(frozen=True)
class ProbeInfo:
    """What a framework reports about itself and this machine (from a throw-away process)."""

    framework: str
    available: bool
    reason: str = ""  # why it is not available
    version: str | None = None
    devices: tuple[DeviceInfo, ...] = ()
    build: dict[str, Any] = field(default_factory=dict)  # CUDA/cuDNN versions, thread counts, ...

    def device_names(self) -> list[str]:
        return [d.name for d in self.devices]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "devices": [asdict(d) for d in self.devices]}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> ProbeInfo:
        return ProbeInfo(
            framework=d["framework"],
            available=d["available"],
            reason=d.get("reason", ""),
            version=d.get("version"),
            devices=tuple(DeviceInfo(**x) for x in d.get("devices", [])),
            build=d.get("build", {}),
        )


class Backend(ABC):
    """A framework. Subclasses must import their framework lazily, inside methods, and set
    ``name``, ``install_hint`` and ``capabilities`` (checked when one is made); ``display_name``
    (the name reports print), ``colours`` (a chart colour per precision) and ``uncompiled``
    (how the framework runs a step with ``compile = none``, for the reports' notes) are optional."""

    name: ClassVar[str]
    install_hint: ClassVar[str]
    capabilities: ClassVar[Capabilities]
    display_name: ClassVar[str] = ""  # "" : ``name``
    colours: ClassVar[dict[str, str]] = {}  # precision -> a matplotlib colour; grey where missing
    uncompiled: ClassVar[str] = ""  # "eager", "one tf.function graph", ...; "" : not said
    # gpubench calibrate: the module that times this framework's training kernels (``python -m
    # MODULE DEVICE`` prints one JSON object; gpubench.measure.kernels has the method); "" : none
    calibration_module: ClassVar[str] = ""
    # the model zoos whose models this framework trains (``timm:<name>``: gpubench.workloads.source)
    zoos: ClassVar[tuple[str, ...]] = ()
    # gpubench advise: whether ``data_workers`` sets this framework's input-pipeline workers; what
    # its ``optimizer_impl = "auto"`` is, per device kind; why an input practice does not apply
    # to it (practice -> reason)
    loader_workers: ClassVar[bool] = False
    auto_optimizer_impl: ClassVar[dict[str, str]] = {}
    input_notes: ClassVar[dict[str, str]] = {}
    # the modules a per-run server imports once and forks each config's worker from
    # (gpubench.runner.forkserver); None: every worker a fresh interpreter (the framework's
    # import starts threads, or makes a device context, that a fork would not carry)
    fork_preload: ClassVar[tuple[str, ...] | None] = None

    @classmethod
    def package_build(cls) -> dict[str, Any] | None:
        """The framework's installed versions (and build), read without importing it; None
        when it is not installed (or the backend does not say)."""
        return None

    @classmethod
    def calibration_key(cls) -> dict[str, Any]:
        """What of this framework's installation decides its kernels' speed: the fields it adds
        to the calibration cache's key ({} : none)."""
        return {}

    def __init__(self) -> None:
        missing = [a for a in ("name", "install_hint", "capabilities") if not hasattr(type(self), a)]
        if missing:
            raise TypeError(f"backend {type(self).__name__} must set: {', '.join(missing)}")
        if not isinstance(self.capabilities, Capabilities):
            raise TypeError(f"backend {type(self).__name__}: capabilities must be a Capabilities value")

    def unsupported(self, config: Config) -> str | None:
        """Why this framework can never run this config, or None: first what it declares it
        supports (``capabilities``), then a zoo that makes another framework's models, then its
        own rules for combinations (``static_unsupported``)."""
        from gpubench.backends.registry import zoo_framework
        from gpubench.workloads.source import parse_workload

        if ":" in config.workload:
            zoo = parse_workload(config.workload, []).zoo
            if zoo is not None and zoo.name not in self.zoos:
                owner = zoo_framework(zoo.name) or "another framework"
                return f"{config.workload} is a {owner} model ({zoo.name}); it trains with framework = {owner}"
        elif ":" in config.loss:
            return (f"loss = {config.loss}: a loss function of your own applies to your own model or a zoo's; "
                    f"{config.workload} is a built-in workload, trained with cross_entropy")
        return (self.capabilities.problem(self.name, config, BACKEND_CHECKED, FUNCTION_CHECKED)
                or self.static_unsupported(config))

    def share_process(self) -> None:  # noqa: B027 - an optional hook
        """Prepare to train in a process that other frameworks may share (the pytest fixture
        trains every framework in pytest's one process; a worker holds one framework). Nothing
        to do by default."""

    @abstractmethod
    def static_unsupported(self, config: Config) -> str | None:
        """Why this framework cannot run this combination of supported values (pure rules, no
        import), or None. Values outside ``capabilities`` never reach it."""

    @abstractmethod
    def probe(self) -> ProbeInfo:
        """Import the framework and describe it and its devices."""

    @abstractmethod
    def check(self, config: Config) -> tuple[str, str] | None:
        """(status, reason) when the config cannot run here ('unavailable' or 'unsupported');
        starts with ``unsupported``."""

    def native(self, config: Config, counts: Path | None = None, count: bool = True) -> NativeModel:
        """The config's model source as this framework's model (imports the user's factory or
        the zoo; raises for a factory that returns no model of this framework). ``counts``: the
        run's directory of FLOP counts, where a backend that counts a model on the host keeps
        the count for the run's other workers (``workloads.source.counted_once``); ``count``
        False: no FLOP count (the pre-run check of a model, which the run counts). By default a
        backend trains the built-in workloads only, translating their spec in ``build``
        (``NativeModel.spec``; ``build()`` gives the spec back)."""
        from gpubench.workloads.dataset import builtin_spec

        if ":" in config.workload:
            raise Unsupported(f"the {self.name} backend trains the built-in workloads only, not {config.workload}")
        spec = builtin_spec(config)
        return spec_native(spec, config, lambda: spec)

    @abstractmethod
    def build(self, model: NativeModel, config: Config, batches: Batches) -> Trainer:
        """The trainer: the model built, on the device, with the data."""

    def set_threads(self, n: int) -> str | None:
        """``threads = n``: make this process train with ``n`` CPU threads (called before the
        trainer is built). None when done, else why this framework cannot."""
        return f"the {self.name} backend cannot set its CPU thread count"

    def before_profiled_build(self, config: Config) -> None:  # noqa: B027 - an optional hook
        """``gpubench profile``: anything the profiler needs set up before the trainer is
        built (nothing by default)."""

    @abstractmethod
    def is_oom(self, exc: BaseException) -> bool:
        """Whether an exception means the device (or host) ran out of memory."""

    def memory_history_problem(self, config: Config) -> str | None:
        """``gpubench profile --memory-history``: why this framework cannot record its device
        allocator's history for this config, or None when ``start_memory_history`` does."""
        return (f"the {self.name} backend records no allocator history (PyTorch's CUDA caching allocator has one: "
                "framework = torch, device = cuda)")

    def start_memory_history(self, config: Config, max_entries: int) -> None:
        """Record every allocation and free from now on, with its stack, keeping the last
        ``max_entries`` (called before the trainer is built, where ``memory_history_problem``
        said none)."""
        raise NotImplementedError(self.memory_history_problem(config))

    def stop_memory_history(self, config: Config) -> None:  # noqa: B027 - an optional hook
        """Stop what ``start_memory_history`` started (nothing by default)."""

    def allocator_snapshot(self, config: Config) -> dict[str, Any] | None:
        """The device allocator's state now, in the shape ``gpubench.measure.allocations``
        reads (PyTorch's ``torch.cuda.memory._snapshot()``), with the recorded history if one is
        being recorded; None where the framework or device has no such allocator. Asked for
        after an out-of-memory failure, and at the end of a recorded config."""
        return None

    def device_uuids(self, config: Config) -> list[str | None]:
        """The framework's UUID of each of the config's GPUs (``config.local_cuda_ordinals``),
        to find them in NVML (None where unknown)."""
        return [None] * len(config.local_cuda_ordinals)

"""The training practices ``gpubench advise`` measures, and which apply to a config.

A practice is a change of suite settings (``precision = "amp-bf16"``, ``compile =
"torch-compile"``, a batch twice as large...), in a group of practices that exclude one
another (one precision, one compile setting). Which values exist comes from the framework's
declared capabilities (``Backend.capabilities``), so a framework added as a package is
advised on with no change here; whether one runs on this machine is decided as for any
config (``runner.sweep.pre_resolve``), and what does not apply says why in one line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from gpubench.backends import resolve_best_compile
from gpubench.config import Config
from gpubench.env import usable_cores
from gpubench.options import device_kind

# the groups, in the order the table lists what does not apply; a group is what --only / --skip name
GROUPS = ("precision", "compile", "memory_format", "optimizer", "batch", "input", "threads", "memory")
BATCH_FACTOR = 2
LR_CAVEAT = (f"the learning rate is left as it is: with a batch {BATCH_FACTOR}x as large, training for real "
             "usually wants it raised (linear scaling, with warm-up), which advise does not do for you")


@dataclass(frozen=True)
class Practice:
    name: str  # how the table names it
    group: str  # one of GROUPS: practices of a group exclude one another
    sets: tuple[tuple[str, Any], ...]  # the suite settings it changes
    caveat: str = ""  # what the user must know before taking it (printed with it)

    @property
    def set_args(self) -> list[str]:
        """The practice as ``--set KEY=VALUE`` arguments."""
        return [f"{k}={v}" for k, v in self.sets]


@dataclass(frozen=True)
class Skipped:
    name: str
    group: str
    reason: str


def _backend(framework: str) -> Any:
    from gpubench.backends.registry import load_class

    return load_class(framework)


def _declared(framework: str, setting: str) -> tuple[str, ...]:
    values: tuple[str, ...] = _backend(framework).capabilities.values(setting)
    return values


def candidates(base: Config) -> tuple[list[Practice], list[Skipped]]:
    """The practices to measure against ``base``, one change each, and those that do not apply
    to it by its settings (each with its reason). Whether a practice runs on this device is
    left to the measurement (it ends ``unsupported`` or ``unavailable`` with the reason)."""
    out: list[Practice] = []
    skipped: list[Skipped] = []
    fw = base.framework
    for p in _declared(fw, "precision"):
        if p != base.precision:
            caveat = "with a gradient scaler (loss scaling)" if p == "amp-fp16" else ""
            out.append(Practice(f"precision {p}", "precision", (("precision", p),), caveat))
    compiles = [c for c in _declared(fw, "compile") if c != base.compile]
    out += _compiles(base, compiles, skipped)
    if not compiles:
        skipped.append(Skipped("compilation", "compile", f"{fw} declares no compile setting other than "
                                                         f"{base.compile}"))
    formats = [m for m in _declared(fw, "memory_format") if m != base.memory_format]
    out += [Practice(f"memory format {m}", "memory_format", (("memory_format", m),)) for m in formats]
    if not formats:
        skipped.append(Skipped("memory format", "memory_format", f"{fw} has one memory format ({base.memory_format})"))
    # the for-loop is the reference implementation every other is a speed-up of: not a practice
    impls = [i for i in _declared(fw, "optimizer_impl") if i not in (base.optimizer_impl, "for-loop", "auto")]
    auto = _backend(fw).auto_optimizer_impl.get(device_kind(base.device)) if base.optimizer_impl == "auto" else None
    if auto in impls:
        impls.remove(auto)
        skipped.append(Skipped(f"optimizer {auto}", "optimizer", f"optimizer_impl = auto is {fw}'s {auto} "
                                                                 f"implementation on {device_kind(base.device)} "
                                                                 "already"))
    out += [Practice(f"optimizer {i}", "optimizer", (("optimizer_impl", i),)) for i in impls]
    if not impls:
        skipped.append(Skipped("optimizer implementation", "optimizer",
                               f"{fw} offers no choice of optimizer implementation in gpubench"))
    if isinstance(base.batch_size, int) and base.target_loss > 0:
        out += _batch_with_rates(base)
    elif isinstance(base.batch_size, int):
        out.append(Practice(f"batch x{BATCH_FACTOR}", "batch", (("batch_size", base.batch_size * BATCH_FACTOR),),
                            LR_CAVEAT))
    else:
        skipped.append(Skipped("larger batch", "batch", f'batch_size = "{base.batch_size}" is searched already'))
    out += _input(base, skipped)
    out += _threads(base, skipped)
    skipped.append(Skipped("data parallelism", "memory", "advise measures the config on its own device(s); compare "
                                                         "strategies with a sweep (parallelism = ddp:N, dp:N, ...)"))
    return out, skipped


def _compiles(base: Config, compiles: list[str], skipped: list[Skipped]) -> list[Practice]:
    """One practice per compile mode measured: a value that resolves to another here
    (``compile = "best"`` is ``torch-compile`` on a CPU) names the mode it is, and is measured
    once under it; one that resolves to the config's own mode is skipped, saying so."""
    own = resolve_best_compile(base).compile
    by_mode: dict[str, list[str]] = {}
    for c in compiles:
        by_mode.setdefault(resolve_best_compile(replace(base, compile=c)).compile, []).append(c)
    out: list[Practice] = []
    for mode, values in by_mode.items():
        aliases = [v for v in values if v != mode]
        if mode == own:
            skipped += [Skipped(f"compile {v}", "compile", f"compile {v} is {mode} for this config, its own") for v in
                        aliases]
            continue
        out.append(Practice(f"compile {mode}" + (f" (= {', '.join(aliases)})" if aliases else ""), "compile",
                            (("compile", mode),)))
    return out


def _batch_with_rates(base: Config) -> list[Practice]:
    """With a target, the larger batch three ways, judged on the time to the target: the
    learning rate kept, scaled linearly (Goyal et al.) and by the square root of the factor
    (Krizhevsky; for Adam, Malladi et al.), the scaled ones with a linear warm-up over the
    first evaluation's steps (``eval_every``), or the config's own warm-up where it has one."""
    big = (("batch_size", base.batch_size * BATCH_FACTOR),)
    warm = base.lr_warmup_steps or base.eval_every
    out = [Practice(f"batch x{BATCH_FACTOR}, lr kept", "batch", big)]
    for name, factor in (("linear", float(BATCH_FACTOR)), ("square root", math.sqrt(BATCH_FACTOR))):
        lr = float(f"{base.lr * factor:.6g}")
        out.append(Practice(f"batch x{BATCH_FACTOR}, lr x{factor:.3g} ({name}, warm-up {warm} steps)", "batch",
                            (*big, ("lr", lr), ("lr_warmup_steps", warm))))
    return out


def _input(base: Config, skipped: list[Skipped]) -> list[Practice]:
    """Input-pipeline practices where the config reads through one."""
    fw = base.framework
    if base.data != "pipeline":
        skipped.append(Skipped("input pipeline", "input", 'data = "device": the batches are resident on the device, '
                                                          "no input pipeline to tune"))
        return []
    out = []
    cls = _backend(fw)
    if cls.loader_workers:
        for workers in sorted({0, max(2, 2 * base.data_workers)} - {base.data_workers}):
            out.append(Practice(f"loader workers {workers}", "input", (("data_workers", workers),)))
    else:
        skipped.append(Skipped("loader workers", "input", f"{fw}'s input pipeline in gpubench has no worker setting"))
    skipped.append(Skipped("pinned memory", "input", cls.input_notes.get(
        "pinned memory", f"{fw}'s input pipeline in gpubench has no pinned-memory setting")))
    if "device" in _declared(fw, "data"):
        out.append(Practice("resident data", "input", (("data", "device"),),
                            "the bound a faster input pipeline can reach: the batches made once, on the device"))
    return out


def _threads(base: Config, skipped: list[Skipped]) -> list[Practice]:
    """On a CPU config: half the threads it trains with (the framework's default: every core
    this process may use). Where other processes share the cores, fewer threads wait less for
    one another; on an idle machine the practice shows what the extra threads buy."""
    if device_kind(base.device) != "cpu":
        skipped.append(Skipped("threads", "threads", f"a {device_kind(base.device)} config's CPU threads feed the "
                                                     "device; advise measures threads on CPU configs"))
        return []
    now = base.threads or usable_cores()
    if now < 2:
        skipped.append(Skipped("threads", "threads", f"the config trains with {now} thread already"))
        return []
    return [Practice(f"threads {now // 2}", "threads", (("threads", now // 2),),
                     "" if base.threads else f"the framework's default uses every core ({now})")]


def memory_followups(base: Config) -> tuple[list[Practice], list[Skipped]]:
    """Where the larger batch did not fit: what fits its samples per step in less memory,
    activation checkpointing at that batch and gradient accumulation at the batch given."""
    out, skipped = [], []
    big = base.batch_size * BATCH_FACTOR if isinstance(base.batch_size, int) else None
    if big is not None and "activations" in _declared(base.framework, "checkpointing"):
        out.append(Practice(f"batch x{BATCH_FACTOR} + checkpointing", "memory",
                            (("batch_size", big), ("checkpointing", "activations")), LR_CAVEAT))
    else:
        skipped.append(Skipped("activation checkpointing", "memory",
                               f"{base.framework} does not checkpoint activations in gpubench"))
    kind = base.parallel.kind
    if kind == "single" and "grad-accum" in _declared(base.framework, "parallelism"):
        out.append(Practice(f"grad-accum:{BATCH_FACTOR}", "memory", (("parallelism", f"grad-accum:{BATCH_FACTOR}"),),
                            f"{BATCH_FACTOR} micro-batches per optimizer step: the larger batch's samples per step "
                            "in the memory of the batch given; " + LR_CAVEAT))
    else:
        skipped.append(Skipped("gradient accumulation", "memory", f"parallelism = {base.parallelism} already"
                               if kind != "single" else f"{base.framework} does not accumulate gradients"))
    return out, skipped


def no_memory_limit() -> Skipped:
    return Skipped("checkpointing, accumulation", "memory", f"the batch x{BATCH_FACTOR} fits: they trade speed for "
                                                            "memory, and apply where memory is the limit")

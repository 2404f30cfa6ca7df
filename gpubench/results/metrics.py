"""The metric registry: every figure of a result that gpubench shows, combines or gates on.

One place declares each metric: its name (the column of the results frame, of the report's
results.csv and of summary tables, and the value of ``compare --metric``), where it lives in a
result line, its unit, which direction is better, how it is formatted, how a config's repeats
combine, and whether the regression gate may use it. The frame, the CSV, the report's tables,
the summaries, the gate, the exporters and docs/reference/metrics.md all read this list, so
adding a metric is one entry here plus the code that measures it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpubench import fmt
from gpubench.results.schema import declare_field
from gpubench.telemetry import contention
from gpubench.workloads.data import TOKEN_KINDS

if TYPE_CHECKING:
    from gpubench.results.result import Result

BETTER = ("higher", "lower", "")  # "": not a figure of merit (context, a label)
# how a value is written: a writer of gpubench.fmt
KINDS = ("rate", "ms", "s", "bytes", "pct", "ratio", "tflops", "joules", "count", "number", "flag", "text")
# how a config's measured repeats combine into its one row: the median; the first repeat's value
# (the same in every repeat: a model's size, a found batch); all / any of a flag; ``to_target``:
# the median over the repeats that trained to a target, one that missed it counting as slower
# than any that reached it (MLPerf counts a run that did not converge so), none where half or
# more missed; ``reached``: how many of those repeats reached it
COMBINE = ("median", "first", "all", "any", "to_target", "reached")


@dataclass(frozen=True)
class Metric:
    name: str
    path: tuple[str, ...]  # block, then keys: ("metrics", "throughput", "median"); () when derived
    unit: str
    better: str
    kind: str
    help: str
    gate: bool = False  # the regression gate (compare, ab) may use it
    combine: str = "median"
    derive: Callable[[Result], Any] | None = None  # a figure computed from several fields
    alias: str = ""  # an older name ``--metric`` still takes
    # the smallest value the gate tells apart (it works on logs): a value below it, 0 included,
    # counts as this much (a counter that drops to 0% is then a regression, not a missing value)
    floor: float | None = None
    # a count the same in every repeat of a config (graph breaks, recompiles): the gate compares
    # it exactly where each side's repeats agree (one repeat a side is enough), by statistics
    # where they do not
    exact: bool = False
    # ``to_target``: where a repeat that missed the target says it stopped (its figure is past
    # this); the gate ranks such a repeat as slower than every repeat that reached it
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.better not in BETTER or self.kind not in KINDS or self.combine not in COMBINE:
            raise ValueError(f"metric {self.name}: better, kind or combine not one of {BETTER}, {KINDS}, {COMBINE}")
        if bool(self.path) == (self.derive is not None):
            raise ValueError(f"metric {self.name}: give a path or a derive function, not both or neither")

    @property
    def higher_is_better(self) -> bool:
        return self.better == "higher"

    def value(self, result: Result) -> Any:
        """This metric of one result, or None where the result does not have it."""
        if self.derive is not None:
            return self.derive(result)
        return result.get(*self.path)

    @property
    def where(self) -> str:
        """Where it lives in a result line, for the docs."""
        return ".".join(self.path) if self.path else "derived"


def _above_peak(r: Result) -> bool:
    """The result says its peak is below what it achieved (or, written before that flag, its
    stored MFU is above 100%)."""
    mfu = r.get("metrics", "mfu")
    return bool(r.get("metrics", "peak_below_achieved")) or (isinstance(mfu, (int, float)) and mfu > 1)


def _tokens_per_sample(r: Result) -> int | None:
    """A language model's tokens a sample (its sequence length): the built-in spec's figure, or
    the length of a token task's input (a Hugging Face model by name); None for other models."""
    n = r.get("model", "tokens_per_sample")
    if n is None and r.get("model", "task") in TOKEN_KINDS:
        shape = r.get("model", "input_shape")
        n = shape[0] if isinstance(shape, list) and shape else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def _per_token(name: str) -> Callable[[Result], Any]:
    def derive(r: Result) -> Any:
        n, value = _tokens_per_sample(r), BY_NAME[name].value(r)
        return value * n if n is not None and isinstance(value, (int, float)) else None
    return derive


M = Metric
METRICS: list[Metric] = [
    M("throughput", ("metrics", "throughput", "median"), "samples/s", "higher", "rate",
      "global samples per second (every rank and micro-batch): samples_per_step x 1000 / median step time",
      gate=True),
    M("throughput_ci_low", ("metrics", "throughput", "ci_low"), "samples/s", "", "rate",
      "95% CI of throughput, low end (one repeat: within the process; several: between repeats)"),
    M("throughput_ci_high", ("metrics", "throughput", "ci_high"), "samples/s", "", "rate",
      "95% CI of throughput, high end"),
    M("throughput_mean", ("metrics", "throughput", "mean"), "samples/s", "higher", "rate",
      "samples_per_step x 1000 / mean step time: what a long run averages"),
    M("throughput_wall", ("metrics", "throughput_wall"), "samples/s", "higher", "rate",
      "samples of all measured windows / their summed wall time (includes anything between steps)"),
    M("throughput_per_device", ("metrics", "throughput_per_device"), "samples/s", "higher", "rate",
      "throughput / devices"),
    M("step_ms", ("metrics", "step_time_ms", "median"), "ms", "lower", "ms",
      "median step time of the measured windows", gate=True, alias="step_time"),
    M("step_ms_p5", ("metrics", "step_time_ms", "p5"), "ms", "lower", "ms", "5th percentile step time"),
    M("step_ms_p95", ("metrics", "step_time_ms", "p95"), "ms", "lower", "ms", "95th percentile step time"),
    M("step_ms_iqr", ("metrics", "step_time_ms", "iqr"), "ms", "lower", "ms", "interquartile range of step times"),
    M("step_cv", ("metrics", "step_time_ms", "cv"), "", "lower", "pct",
      "coefficient of variation of step times (sample std / mean)"),
    M("n_steps", ("metrics", "step_time_ms", "n"), "steps", "", "count", "measured steps"),
    M("samples_per_step", ("metrics", "samples_per_step"), "samples", "", "count",
      "global samples per optimizer step", combine="first"),
    M("devices", ("metrics", "devices"), "", "", "count", "devices one step runs on (ranks, replicas or stages)",
      combine="first"),
    M("noisy", ("metrics", "noisy"), "", "", "flag", "step-time cv above 10%", combine="any"),
    M("others_cores", ("telemetry", "host", "others_cores"), "cores", "", "number",
      "CPU cores every other process on the machine used over the measured windows, first start to last end (the "
      "machine's busy cores less the worker's process tree: its ranks and data workers are not others); null "
      f"over a span under {contention.MIN_SPAN_S:g} s"),
    M("shared_cores", ("telemetry", "host", "shared_cores"), "", "", "flag",
      f"the config shared its cores with other processes over its measured windows ({contention.RULE}): its "
      "figures are lower than an idle machine's", combine="any"),
    M("cold_start_ms", ("metrics", "cold_start_ms"), "ms", "lower", "ms",
      "the first training step (allocation, autotuning, compilation), synchronised"),
    M("setup_ms", ("metrics", "setup_ms"), "ms", "lower", "ms", "building model, optimizer and data on the device"),
    M("loss_first", ("metrics", "loss", "first"), "", "", "number", "loss after the cold-start step"),
    M("loss_last", ("metrics", "loss", "last"), "", "", "number", "loss after the last window"),
    M("loss_fell", ("metrics", "loss", "fell"), "", "", "flag", "whether the loss went down", combine="all"),
    M("peak_memory_bytes", (), "bytes", "lower", "bytes",
      "the peak memory training needed: device allocator peak on a GPU, else the peak RSS while training "
      "(else over the worker's life); peak_memory_source says which", gate=True, derive=lambda r: r.peak_memory()[0],
      alias="peak_memory"),
    # compile costs, gated like any figure: a change that adds a graph break or a recompilation
    # fails the gate even where the step time hides it (a count of 0 counts as 0.5: 0 -> 1 is 2x)
    M("compile_s", ("metrics", "compile_s"), "s", "lower", "s",
      "the first call of a step compiled at run time (torch.compile, jax.jit, tf.function), compilation and one "
      "step, synchronised: cold_start_ms of a config that compiles, in seconds; absent for one that does not",
      gate=True),
    M("graph_breaks", ("metrics", "graph_breaks"), "", "lower", "count",
      "PyTorch torch.compile: graph breaks in the first step's compilation (Dynamo's counter), where the compiled "
      "step falls back to Python", gate=True, floor=0.5, exact=True),
    M("recompiles", ("metrics", "recompiles"), "", "lower", "count",
      "compilations after the first step (a guard or shape that changed: Dynamo's recompiles, a jax.jit retrace); "
      "0 expected", gate=True, floor=0.5, exact=True),
    M("peak_memory_source", (), "", "", "text", "which figure peak_memory_bytes is", combine="first",
      derive=lambda r: r.peak_memory()[1]),
    M("peak_rss_bytes", ("metrics", "memory", "peak_rss_bytes"), "bytes", "lower", "bytes",
      "worker peak RSS over its whole life"),
    M("train_peak_rss_bytes", ("metrics", "memory", "train_peak_rss_bytes"), "bytes", "lower", "bytes",
      "worker peak RSS while training (Linux)"),
    M("peak_allocated_bytes", ("metrics", "memory", "peak_allocated_bytes"), "bytes", "lower", "bytes",
      "GPU: the framework allocator's peak"),
    M("peak_reserved_bytes", ("metrics", "memory", "peak_reserved_bytes"), "bytes", "lower", "bytes",
      "GPU: PyTorch's caching allocator's reserved peak"),
    M("state_bytes_per_device", ("metrics", "memory", "state_bytes_per_device"), "bytes", "lower", "bytes",
      "the training state resident on one device (rank 0's): parameters, gradients (PyTorch keeps them between "
      "steps) and optimizer state, each as the device holds it (1/N of a tensor that fsdp:N or tp:N shards); "
      "metrics.memory.state_bytes has the three parts, metrics.ranks each rank's", gate=True),
    M("data_bytes", ("metrics", "memory", "data_bytes"), "bytes", "", "bytes", "device-resident data pool"),
    M("oom_requested_bytes", ("metrics", "oom", "requested_bytes"), "bytes", "", "bytes",
      "an oom config on a device allocator that records its history: the request that failed"),
    M("oom_allocated_bytes", ("metrics", "oom", "allocated_bytes"), "bytes", "", "bytes",
      "an oom config (PyTorch on CUDA): what the allocator had allocated at the failure"),
    M("energy_per_sample_j", ("telemetry", "gpu", "energy_per_sample_j"), "J", "lower", "joules",
      "GPU energy over the measured windows / samples trained in them", gate=True, alias="energy_per_sample"),
    M("tokens_per_s", (), "tokens/s", "higher", "rate",
      "a language model's global tokens per second: throughput x tokens a sample (its sequence length)",
      gate=True, derive=_per_token("throughput")),
    M("tokens_per_s_per_device", (), "tokens/s", "higher", "rate", "tokens_per_s / devices",
      derive=_per_token("throughput_per_device")),
    M("tokens_per_sample", (), "tokens", "", "count", "a language model's tokens a sample (sequence length)",
      combine="first", derive=_tokens_per_sample),
    # tensor-core activity is the one counter with a direction: a change that moves the matmuls
    # off the tensor cores (a dtype cast, TF32 turned off) shows as a drop, so the gate takes it
    M("tensor_active_pct", ("telemetry", "gpu", "tensor_active_pct_mean"), "%", "higher", "number",
      "GPU (NVML GPM, Hopper and later): share of time any tensor-core pipe was active, mean over the measured "
      "windows; null where the GPU or driver does not serve it (telemetry.gpu.not_reported.gpm says why); the gate "
      "counts a value under 0.1% as 0.1%", gate=True, floor=0.1),
    *(M(name, ("telemetry", "gpu", f"{name}_mean"), unit, "", kind, f"GPU (NVML GPM, Hopper and later): {what}, "
        "mean over the measured windows; null where the GPU or driver does not serve it "
        "(telemetry.gpu.not_reported.gpm says why)")
      for name, unit, kind, what in (
          ("tensor_hmma_pct", "%", "number", "share of time the half-precision (HMMA) tensor pipe was active"),
          ("sm_active_pct", "%", "number", "share of time the SMs had work (SM activity)"),
          ("sm_occupancy_pct", "%", "number", "resident warps as a share of the SMs' maximum (SM occupancy)"),
          ("dram_bw_pct", "%", "number", "DRAM bandwidth used, as a share of the peak"),
          ("fp32_pct", "%", "number", "FP32 pipe utilisation"),
          ("fp16_pct", "%", "number", "FP16 pipe utilisation"),
          ("pcie_tx_mib_s", "MiB/s", "number", "PCIe traffic sent"),
          ("pcie_rx_mib_s", "MiB/s", "number", "PCIe traffic received"),
          ("nvlink_tx_mib_s", "MiB/s", "number", "NVLink traffic sent"),
          ("nvlink_rx_mib_s", "MiB/s", "number", "NVLink traffic received"))),
    M("achieved_tflops", ("metrics", "achieved_tflops"), "TFLOP/s", "higher", "tflops",
      "model training FLOPs per sample x throughput"),
    M("peak_tflops", ("metrics", "peak_tflops"), "TFLOP/s", "", "tflops",
      "the measured peak MFU is against (gpubench calibrate)"),
    M("mfu", (), "", "higher", "pct",
      "MFU against the measured peak: achieved_tflops / peak_tflops; never above 100%: a result above its peak has "
      "none (above_peak)",
      derive=lambda r: None if _above_peak(r) else r.get("metrics", "mfu")),
    M("datasheet_tflops", ("metrics", "datasheet_tflops"), "TFLOP/s", "", "tflops",
      "the datasheet's dense peak of the GPU at the config's precision, times its devices (metrics.datasheet: the "
      "row and its source)"),
    M("mfu_datasheet", ("metrics", "mfu_datasheet"), "", "higher", "pct",
      "MFU against the datasheet's dense peak (the convention of published MFUs: PaLM, nanoGPT, llm.c, "
      "torchtitan): achieved_tflops / datasheet_tflops; none where achieved is above it (achieved_above_datasheet)"),
    M("hfu", ("metrics", "hfu"), "", "higher", "pct",
      "hardware FLOP utilisation against the measured peak, where activation checkpointing recomputes layers: "
      "achieved_hardware_tflops / peak_tflops (the recomputed forward counted; MFU leaves it out)"),
    M("hfu_datasheet", ("metrics", "hfu_datasheet"), "", "higher", "pct",
      "hardware FLOP utilisation against the datasheet's dense peak, where activation checkpointing recomputes "
      "layers"),
    M("achieved_hardware_tflops", ("metrics", "achieved_hardware_tflops"), "TFLOP/s", "higher", "tflops",
      "hardware FLOPs per sample (model FLOPs plus the forward checkpointing recomputes) x throughput"),
    M("above_peak", (), "", "", "flag",
      "achieved more than the calibrated peak, which is then no ceiling: recalibrate (gpubench calibrate --force)",
      combine="any", derive=_above_peak),
    M("cost_per_million_samples", ("metrics", "cost", "per_million_samples"), "per 1M samples", "lower", "number",
      "gpubench run --price: price per device-hour x devices billed / throughput, per million samples"),
    M("cost_per_million_tokens", ("metrics", "cost", "per_million_tokens"), "per 1M tokens", "lower", "number",
      "gpubench run --price: the same per million tokens (a language model)"),
    M("config_cost", ("metrics", "cost", "config"), "", "lower", "number",
      "gpubench run --price: what the config repeat cost, its whole duration (setup, compilation, warm-up, "
      "measuring) x devices billed x price"),
    M("max_batch", ("metrics", "batch_search", "max_batch"), "samples", "higher", "count",
      'batch_size = "max": the largest batch that trained', combine="first"),
    M("batch_trained", (), "samples", "", "count",
      'the batch a config trained at (a "max" config: the one its search found)', combine="first",
      derive=lambda r: r.trained_batch()),
    M("params", ("model", "params"), "", "", "count", "model parameters", combine="first"),
    M("flops_per_sample", ("model", "flops_per_sample"), "FLOP", "", "count",
      "training FLOPs per sample (forward + backward)", combine="first"),
    M("hardware_flops_per_sample", ("model", "hardware_flops_per_sample"), "FLOP", "", "count",
      "training FLOPs per sample the device computes: flops_per_sample plus the forward activation checkpointing "
      "recomputes (model.recomputed_flops_per_sample)", combine="first"),
    M("step_timing", ("runtime", "step_timing"), "", "", "text",
      "how steps were timed: cuda_events, host_clock or window_mean", combine="first"),
    *(M(f"breakdown_{phase}_ms", ("metrics", "breakdown", f"{phase}_ms"), "ms", "", "ms",
        f"gpubench profile: {what}")
      for phase, what in (("data", "data phase per step"), ("forward", "forward phase per step"),
                          ("backward", "backward phase per step"), ("optimizer", "optimizer phase per step"),
                          ("idle", "step time outside the phases"),
                          ("overlap", "what a real step gains by overlapping its phases"),
                          ("step", "the measured median step time the phases are compared with"))),
    M("breakdown_timing", ("metrics", "breakdown", "timing"), "", "", "text",
      "gpubench profile: how the phases were timed", combine="first"),
    M("time_to_target_s", ("metrics", "target", "time_to_target_s"), "s", "lower", "s",
      "target_loss: seconds from the first training step (its compilation included) to the end of the "
      "evaluation that reached the target, the evaluations included (MLPerf's count); over repeats (each its "
      "own seeds) the median, a repeat that missed the target counting as the slowest", gate=True,
      combine="to_target", stop=("metrics", "target", "stopped_s")),
    M("steps_to_target", ("metrics", "target", "steps_to_target"), "steps", "lower", "count",
      "target_loss: training steps until the evaluation that reached it", gate=True, combine="to_target",
      stop=("metrics", "target", "stopped_steps")),
    M("samples_to_target", ("metrics", "target", "samples_to_target"), "samples", "lower", "count",
      "target_loss: samples trained until the evaluation that reached it (steps x samples_per_step)", gate=True,
      combine="to_target", stop=("metrics", "target", "stopped_samples")),
    M("energy_to_target_j", ("metrics", "target", "energy_to_target_j"), "J", "lower", "joules",
      "target_loss on a GPU: the devices' energy (NVML's counter) over the time to target, the evaluations "
      "included", gate=True, combine="to_target", stop=("metrics", "target", "stopped_energy_j")),
    M("target_reached", ("metrics", "target", "reached"), "", "", "count",
      "target_loss: how many repeats reached the target (the summary writes it k/n)", combine="reached"),
    M("eval_share", ("metrics", "target", "eval_share"), "", "", "pct",
      "target_loss: the evaluations' share of the time to target"),
    M("target_best_loss", ("metrics", "target", "best_loss"), "", "", "number",
      "target_loss: the lowest held-out loss of the run's evaluations"),
    M("duration_s", (), "s", "", "s", "wall time of the config, process start-up included",
      derive=lambda r: r.duration_s),
]
BY_NAME: dict[str, Metric] = {m.name: m for m in METRICS}


def _declare(m: Metric) -> None:
    """The metric's field, typed as its kind, for the check every loaded line passes (a figure
    combined by any, all or reached is a flag in each result, whatever its combined kind)."""
    if m.path:
        flag = m.kind == "flag" or m.combine in ("any", "all", "reached")
        declare_field(".".join(m.path), "flag" if flag else "text" if m.kind == "text" else "number")


for _m in METRICS:
    _declare(_m)
GATE_METRICS: dict[str, Metric] = {n: m for m in METRICS if m.gate for n in (m.name, m.alias) if n}


@dataclass(frozen=True)
class SummaryColumn:
    """A metric column of a run's summary: the terminal's table (``terminal``) and summary.md
    (``markdown``, under ``long`` where it differs from ``header``). ``optional``: shown only
    where some result has the figure (a language model's tokens/s, a GPU's GPM counter)."""

    header: str
    metric: str
    optional: bool = False
    terminal: bool = True
    markdown: bool = True
    long: str = ""


# the summary's metric columns, in order, declared once for the terminal table and summary.md
SUMMARY_COLUMNS = (SummaryColumn("samples/s", "throughput"), SummaryColumn("tokens/s", "tokens_per_s", optional=True),
                   SummaryColumn("step", "step_ms"), SummaryColumn("cv", "step_cv"),
                   SummaryColumn("cold", "cold_start_ms", markdown=False),
                   SummaryColumn("compile", "compile_s", optional=True, terminal=False, long="compile (first step)"),
                   SummaryColumn("peak mem", "peak_memory_bytes", long="peak memory"),
                   SummaryColumn("TFLOP/s", "achieved_tflops", terminal=False),
                   SummaryColumn("MFU", "mfu", long="MFU (measured peak)"),
                   SummaryColumn("MFU sheet", "mfu_datasheet", optional=True, long="MFU (datasheet peak)"),
                   SummaryColumn("HFU", "hfu", optional=True, long="HFU (measured peak)"),
                   SummaryColumn("HFU sheet", "hfu_datasheet", optional=True, terminal=False,
                                 long="HFU (datasheet peak)"),
                   SummaryColumn("tensor %", "tensor_active_pct", optional=True),
                   SummaryColumn("cost/M samples", "cost_per_million_samples", optional=True,
                                 long="cost per 1M samples"),
                   SummaryColumn("cost/M tokens", "cost_per_million_tokens", optional=True, terminal=False,
                                 long="cost per 1M tokens"),
                   SummaryColumn("to target", "time_to_target_s", optional=True, long="time to target"))


def cost_line(results: Iterable[Result]) -> str | None:
    """What the priced config repeats cost together (``gpubench run --price``), for the summaries;
    None where none was priced."""
    costs = [c for r in results if (c := BY_NAME["config_cost"].value(r)) is not None]
    if not costs:
        return None
    return (f"cost at the prices given (--price): {fmt.number(sum(costs))} for the {len(costs)} priced config "
            "repeat(s), each its whole duration x the devices billed x the price per device-hour")


def register_metric(m: Metric) -> None:
    """Add a metric (a plugin's figure): from then on the frame, the CSV, the summaries and,
    where ``gate``, ``compare --metric`` know it."""
    if m.name in BY_NAME or m.name in GATE_METRICS or (m.alias and m.alias in GATE_METRICS):
        raise ValueError(f"metric {m.name!r} is registered already")
    METRICS.append(m)
    BY_NAME[m.name] = m
    _declare(m)
    if m.gate:
        GATE_METRICS.update({n: m for n in (m.name, m.alias) if n})


def median_to_target(times: Iterable[float], missed: int) -> float | None:
    """The median time (steps, samples) to a target over a config's repeats, the ``missed`` ones
    slower than any that reached it; None where half or more missed (their median is no time)."""
    values = [*times, *[math.inf] * missed]
    if not values:
        return None
    median = statistics.median(values)
    return float(median) if math.isfinite(median) else None


def gate_metric_names() -> list[str]:
    """What ``--metric`` takes, for messages: each gateable metric's name (and the older name it
    still answers to)."""
    return [m.name + (f" (or {m.alias})" if m.alias else "") for m in METRICS if m.gate]


def reference_markdown() -> str:
    """The metric table of docs/reference/metrics.md (a test checks the page holds exactly this)."""
    lines = ["| metric | in a result line | unit | better | repeats | gate | meaning |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for m in METRICS:
        name = f"`{m.name}`" + (f" (`{m.alias}`)" if m.alias else "")
        lines.append(f"| {name} | `{m.where}` | {m.unit or '-'} | {m.better or '-'} | {m.combine} | "
                     f"{'yes' if m.gate else '-'} | {m.help} |")
    return "\n".join(lines) + "\n"


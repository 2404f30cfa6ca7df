"""What training cost, at a price per device-hour the user gives (``gpubench run --price``).

The price is one number for every device, or a TOML table the user keeps: a price per device
model, by the name results give it (``"NVIDIA H100 80GB HBM3" = 2.49``), with ``cuda`` and
``cpu`` for any other GPU or CPU. A GPU config is billed for each GPU it trained on; a CPU
config for each node's machine (its ranks share one CPU, as for MFU). Each ok result gets
``metrics.cost``:

- ``per_million_samples`` = price x devices billed / the steady throughput (median) x 1e6 / 3600,
  and ``per_million_tokens`` for a language model: the training itself, at its steady rate;
- ``config``: price x devices billed x the repeat's whole duration (start, setup, compilation,
  warm-up and measuring included) / 3600: what running this config repeat cost;
- ``price_per_device_hour``, ``priced_as`` (the table's key that priced it) and ``devices_billed``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpubench.config import Config
from gpubench.errors import InputError
from gpubench.files import read_user_text
from gpubench.options import device_kind
from gpubench.results.frame import device_model
from gpubench.results.result import Result
from gpubench.suite import tomllib  # the standard library's, or tomli on Python 3.10

ANY = "*"  # the key of a single --price number: every device


@dataclass(frozen=True)
class Prices:
    """A price per device-hour by device model, device kind (``cuda``, ``cpu``) or for any
    device (``*``), in the user's currency."""

    table: dict[str, float]
    source: str  # "--price 2.5" or the file's path

    def of(self, model: str | None, kind: str) -> tuple[str, float] | None:
        """(the key that prices this device, its price), the model's first, then its kind's."""
        for key in (model, kind, ANY):
            if key is not None and key in self.table:
                return key, self.table[key]
        return None

    def to_dict(self) -> dict[str, Any]:
        """As run.json keeps it (``args.prices``), so that a resumed run prices what it adds the same."""
        return {"source": self.source, "table": dict(self.table)}

    @staticmethod
    def from_dict(d: Any, where: str) -> Prices | None:
        """run.json's ``args.prices`` (None where the run was not priced); checked as --price is."""
        if d is None:
            return None
        table = d.get("table") if isinstance(d, dict) else None
        if (not isinstance(table, dict) or not table or not isinstance(d.get("source"), str)
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
                           for v in table.values())):
            raise InputError(f"{where}: args.prices: expected {{source, table}} with prices > 0, as gpubench run "
                             "--price writes it")
        return Prices({str(k): float(v) for k, v in table.items()}, d["source"])


def parse_prices(text: str) -> Prices:
    """``--price``: a number > 0, or the path of a TOML file of ``"device model" = price``
    lines (``cuda`` and ``cpu`` for any other). Raises InputError naming the file and key."""
    if not text.strip():
        raise InputError(f"--price {text!r}: expected a price per device-hour > 0, or a TOML file of prices")
    try:
        number = float(text)
    except ValueError:
        number = None
    if number is not None:
        if not math.isfinite(number) or number <= 0:
            raise InputError(f"--price {text}: expected a price per device-hour > 0, or a TOML file of prices")
        return Prices({ANY: number}, f"--price {text}")
    path = Path(text)
    if not path.exists():
        raise InputError(f"--price {text}: neither a number nor a file (expected a price per device-hour > 0, or a "
                         "TOML file of prices)")
    try:
        data = tomllib.loads(read_user_text(path, "--price"))
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"--price {text}: not TOML: {e}") from None
    table: dict[str, float] = {}
    for key, value in data.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise InputError(f"{text}: {key}: expected a price per device-hour > 0, got {value!r} (a device model "
                             "as results name it, cuda or cpu, = a number)")
        table[key] = float(value)
    if not table:
        raise InputError(f"{text}: no prices (lines such as \"NVIDIA H100 80GB HBM3\" = 2.49, cuda = 2.0, cpu = 0.1)")
    return Prices(table, text)


def resumed_prices(given: Prices | None, stored: Prices | None, run_dir: Path) -> Prices | None:
    """The prices a resumed run goes on with: its own; a --price that differs is refused, since
    the finished results keep the cost they were given (and the summary adds them up)."""
    if given is None or (stored is not None and given.table == stored.table):
        return stored
    was = f"priced with {stored.source}" if stored is not None else "started without --price"
    raise InputError(f"--resume {run_dir}: {given.source}: that run was {was}, and its finished results keep what "
                     "they were given; leave out --price (the run goes on as it started), or start a new run")


def unpriced_lines(results: list[Result], prices: Prices) -> list[str]:
    """A warning line per device that ok results trained on but ``prices`` has no price for
    (no cost given to those results)."""
    missing: dict[str, int] = {}
    for r in results:
        if r.status == "ok" and r.get("metrics", "throughput", "median") and not r.get("metrics", "cost"):
            kind = device_kind(Config.from_dict(r.config).device)
            name = f"{device_model(r) or kind} ({kind})" if kind == "cuda" else kind
            missing[name] = missing.get(name, 0) + 1
    return [f"{prices.source}: no price for {name}: {n} config repeat(s) not priced (the prices are for: "
            f"{', '.join(prices.table)}; add the device model, or {name.split(' (')[-1].rstrip(')')} for any)"
            for name, n in missing.items()]


def cost_metrics(result: Result, prices: Prices) -> dict[str, Any] | None:
    """``metrics.cost`` of an ok result whose device has a price; None otherwise."""
    rate = result.get("metrics", "throughput", "median")
    if result.status != "ok" or not rate:
        return None
    config = Config.from_dict(result.config)
    kind = device_kind(config.device)
    priced = prices.of(device_model(result) if kind == "cuda" else None, kind)
    if priced is None:
        return None
    key, price = priced
    billed = config.devices if kind == "cuda" else config.nnodes
    per_second = price * billed / 3600.0
    out: dict[str, Any] = {"price_per_device_hour": price, "priced_as": key, "devices_billed": billed,
                           "per_million_samples": per_second / rate * 1e6}
    tokens = result.get("model", "tokens_per_sample")
    if tokens:
        out["per_million_tokens"] = per_second / (rate * tokens) * 1e6
    if result.duration_s:
        out["config"] = per_second * result.duration_s
    return out

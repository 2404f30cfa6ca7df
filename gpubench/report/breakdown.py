"""The where-time-goes breakdown (``metrics.breakdown``, from ``gpubench profile``): a table
of ms per step and a stacked bar chart of each config's shares."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from gpubench import fmt  # noqa: E402
from gpubench.files import write_atomic  # noqa: E402
from gpubench.report.charts import STYLE  # noqa: E402
from gpubench.report.tables import having  # noqa: E402

SEGMENTS = [("data", "#9467bd"), ("forward", "#1f77b4"), ("backward", "#ff7f0e"), ("optimizer", "#2ca02c"),
            ("idle", "#c7c7c7")]


def breakdown_table(configs: pd.DataFrame, multi_run: bool = False) -> pd.DataFrame:
    """ms per step: the measured step, each phase, idle and overlap; the timing method."""
    rows = having(configs, "breakdown_forward_ms")
    out = pd.DataFrame({**({"run": rows["run"]} if multi_run else {}), "config": rows["config_id"],
                        "step": rows["breakdown_step_ms"].map(fmt.ms)})
    for name in ("data", "forward", "backward", "optimizer", "idle", "overlap"):
        out[name] = rows[f"breakdown_{name}_ms"].map(fmt.ms)
    out["timed by"] = rows["breakdown_timing"]
    return out.reset_index(drop=True)


def breakdown_chart(configs: pd.DataFrame, path: Path) -> Path | None:
    """One horizontal bar per config: the shares of data / forward / backward / optimizer /
    idle in their sum, with the measured step time written at the bar's end."""
    rows = having(configs, "breakdown_forward_ms")
    if rows.empty:
        return None
    multi = rows["run"].nunique() > 1
    labels = [(f"{r.run}: " if multi else "") + r.config_id for r in rows.itertuples()]
    ms = np.array([[float(getattr(r, f"breakdown_{name}_ms") or 0.0) for name, _ in SEGMENTS]
                   for r in rows.itertuples()])
    shares = 100.0 * ms / np.maximum(ms.sum(axis=1, keepdims=True), 1e-12)
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(9, max(2.2, 0.35 * len(rows) + 1.6)), layout="constrained")
        y = np.arange(len(rows))
        left = np.zeros(len(rows))
        for k, (name, color) in enumerate(SEGMENTS):
            ax.barh(y, shares[:, k], left=left, color=color, label=name)
            left += shares[:, k]
        for yi, step in zip(y, rows["breakdown_step_ms"]):
            ax.text(101, float(yi), f"step {fmt.ms(step)}", va="center", fontsize=7)
        ax.set_yticks(y, labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlim(0, 125)
        ax.set_xlabel("share of the step (%; phases timed alone, idle = measured step - phases)")
        ax.set_title("Where time goes per training step (gpubench profile)")
        ax.grid(axis="y", visible=False)
        fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncol=len(SEGMENTS), frameon=False)
        write_atomic(path, fig.savefig)
        plt.close(fig)
    return path

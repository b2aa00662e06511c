"""Training curves: one row per optimizer step to CSV (and TensorBoard when installed),
a PNG of the chosen columns; both registered as DVC plots in ``dvc.yaml``."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from common.io import atomic_path


class MetricsLog:
    """Collects ``{"step": int, name: float, ...}`` rows; :meth:`write` saves CSV and PNG atomically.

    Args:
        csv_path: CSV output (columns: the union of every row's keys, ``step`` first).
        tensorboard_dir: event files go here when ``tensorboard`` is importable.
    """

    def __init__(self, csv_path: str | Path, tensorboard_dir: str | Path | None = None):
        self.csv_path = Path(csv_path)
        self.rows: list[dict[str, Any]] = []
        self.tb = None
        if tensorboard_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                pass
            else:
                self.tb = SummaryWriter(str(tensorboard_dir))

    def log(self, step: int, values: dict[str, float]) -> None:
        """Record the values of optimizer step ``step``."""
        self.rows.append({"step": step, **values})
        if self.tb is not None:
            for k, v in values.items():
                self.tb.add_scalar(k, v, step)

    def write(self, png_path: str | Path | None = None, columns: tuple[str, ...] = ()) -> None:
        """Write the CSV and, given ``png_path``, one PNG panel per column in ``columns`` that exists."""
        keys = list(dict.fromkeys(k for row in self.rows for k in row))
        with atomic_path(self.csv_path) as tmp, tmp.open("w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=keys or ["step"])
            w.writeheader()
            w.writerows(self.rows)
        if png_path is not None:
            plot_curves(self.rows, png_path, [c for c in columns if c in keys])
        if self.tb is not None:
            self.tb.flush()


def plot_curves(rows: list[dict[str, Any]], png_path: str | Path, columns: list[str]) -> None:
    """One panel per column against ``step`` (matplotlib, Agg backend), written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = columns or ["step"]
    fig, axes = plt.subplots(1, len(columns), figsize=(4 * len(columns), 3), squeeze=False)
    for ax, col in zip(axes[0], columns, strict=True):
        pts = [(r["step"], r[col]) for r in rows if isinstance(r.get(col), (int, float)) and math.isfinite(r[col])]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o")
        ax.set_xlabel("step")
        ax.set_title(col)
    fig.tight_layout()
    with atomic_path(png_path) as tmp:
        fig.savefig(tmp, format="png", dpi=80)
    plt.close(fig)

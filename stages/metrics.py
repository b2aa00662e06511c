"""Training curves, live while a stage runs and whole at its end.

Per optimizer step, when it ends: one JSON line appended (and flushed) to ``<live_dir>/steps.jsonl``,
and the step's scalars through dvclive (``<live_dir>/metrics.json`` and
``<live_dir>/plots/metrics/<name>.tsv``: what ``dvc plots show``, ``dvc exp show`` and DVC's VS Code
extension read), and TensorBoard when installed. At the end (and with every training state): the CSV of
all rows and a PNG of chosen columns, both registered as DVC plots in ``dvc.yaml``. A resumed run
rewrites the live files from the rows of its training state, so no step appears twice.
"""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path
from typing import Any

from common.io import atomic_path


class MetricsLog:
    """Collects ``{"step": int, name: float, ...}`` rows, live (:meth:`log`) and whole (:meth:`write`).

    A value that is not a number (an MoE step's ``expert_load``: tokens per expert per layer) is kept in
    the row and ``steps.jsonl`` only, not in dvclive, TensorBoard or the CSV.

    Args:
        csv_path: CSV output (columns: the union of every row's keys, ``step`` first).
        live_dir: the live files (dvclive's and ``steps.jsonl``), started by :meth:`start`.
        tensorboard_dir: event files go here when ``tensorboard`` is importable.
        writer: False on data-parallel ranks other than 0: the rows are kept, no file is written.
    """

    def __init__(self, csv_path: str | Path, live_dir: str | Path, tensorboard_dir: str | Path | None = None,
                 writer: bool = True):
        self.csv_path, self.live_dir, self.writer = Path(csv_path), Path(live_dir), writer
        self.rows: list[dict[str, Any]] = []
        self.live: Any = None
        self.tb = None
        if tensorboard_dir is not None and writer:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                pass
            else:
                self.tb = SummaryWriter(str(tensorboard_dir))

    def start(self, rows: list[dict[str, Any]] = ()) -> None:
        """Empty the live files, then (a resumed run) log ``rows`` again: the rows of the state resumed."""
        self.rows = []
        if not self.writer:
            self.rows.extend({**row} for row in rows)
            return
        from dvclive import Live

        shutil.rmtree(self.live_dir, ignore_errors=True)
        self.live_dir.mkdir(parents=True)
        self.live = Live(dir=str(self.live_dir), save_dvc_exp=False, dvcyaml=None)
        # dvclive's plots dir exists before any step (dvc.yaml declares it): a stage that logs no step
        # (a disabled one passing its init through) still leaves every declared output
        (self.live_dir / "plots" / "metrics").mkdir(parents=True, exist_ok=True)
        for row in rows:
            self.log(row["step"], {k: v for k, v in row.items() if k != "step"})

    def log(self, step: int, values: dict[str, float]) -> None:
        """Record the values of optimizer step ``step``, on disk before returning.

        Raises:
            RuntimeError: before :meth:`start`.
        """
        if self.live is None and self.writer:
            raise RuntimeError("MetricsLog.start() first: it sets up the live files")
        row = {"step": step, **values}
        self.rows.append(row)
        if not self.writer:
            return
        with (self.live_dir / "steps.jsonl").open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        self.live.step = step
        values = _scalars(values)
        for k, v in values.items():  # dvclive nests on "/": reward and reward/math would collide
            self.live.log_metric(k.replace("/", "."), v)
        self.live.make_summary()
        if self.tb is not None:
            for k, v in values.items():
                self.tb.add_scalar(k, v, step)

    def write(self, png_path: str | Path | None = None, columns: tuple[str, ...] = ()) -> None:
        """Write the CSV and, given ``png_path``, one PNG panel per column in ``columns`` that exists."""
        if not self.writer:
            return
        rows = [_scalars(row) for row in self.rows]
        keys = list(dict.fromkeys(k for row in rows for k in row))
        with atomic_path(self.csv_path) as tmp, tmp.open("w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=keys or ["step"])
            w.writeheader()
            w.writerows(rows)
        if png_path is not None:
            plot_curves(self.rows, png_path, [c for c in columns if c in keys])
        if self.tb is not None:
            self.tb.flush()


def _scalars(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if isinstance(v, (int, float))}


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

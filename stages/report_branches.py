"""Alternatives in ``cascade report`` (``cascade.report.compare``): a stage run from the same init as a stage
of the order (continued GRPO beside MOPD), compared with it prompt by prompt on the validation rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stages.bootstrap import paired_delta
from stages.checkpoints import read_scores
from stages.report import metric_values


def versus(checkpoint_root: str | Path, stage: str, other: str, metric: str = "reward",
           confidence: float = 0.95) -> dict[str, dict[str, float]]:
    """``{domain: {delta, ci_low, ci_high, n}}``: ``stage`` minus ``other`` on the validation prompts both
    answered, paired bootstrap (two branches from one init: MOPD and the GRPO it is compared with)."""
    root = Path(checkpoint_root)
    a, b = read_scores(root / stage), read_scores(root / other)
    out = {}
    for d in sorted(set(a) & set(b)):
        delta = paired_delta(metric_values(a[d], metric), metric_values(b[d], metric), confidence)
        if delta is not None:
            out[d] = delta
    return out


def branches_markdown(report: dict[str, Any]) -> str:
    """Each ``compare`` alternative: its validation row with deltas against its init, what it recovered, and
    the stage it is compared with minus it (paired), as Markdown."""
    lines: list[str] = []
    for alt, b in report.get("branches", {}).items():
        domains = report["domains"]
        deltas = {d["domain"]: d for d in b["deltas"]}
        lines += ["", f"Alternative `{alt}` (from `{b['init']}`, as `{b['replaces']}`):", "",
                  f"| stage | {' | '.join(domains)} |", "|---|" + "---|" * len(domains)]
        cells = []
        for d in domains:
            iv, x = b["interval"].get(d), deltas.get(d)
            cell = "-" if not iv else f"{iv['mean']:.3f} [{iv['ci_low']:.3f}, {iv['ci_high']:.3f}]"
            if x:
                cell += f"<br>Δ {x['delta']:+.3f} [{x['ci_low']:+.3f}, {x['ci_high']:+.3f}]"
            cells.append(cell)
        lines.append(f"| {alt} | {' | '.join(cells)} |")
        vs = b["versus"]
        lines += ["", f"| {b['replaces']} − {alt} (paired) | {' | '.join(domains)} |", "|---|" + "---|" * len(domains),
                  "| Δ | " + " | ".join(f"{vs[d]['delta']:+.3f} [{vs[d]['ci_low']:+.3f}, {vs[d]['ci_high']:+.3f}]"
                                        if d in vs else "-" for d in domains) + " |"]
        for r in b["recovered"]:
            lines.append(f"\n{alt} {r['domain']}: {r['before']:.3f} -> {r['after']:.3f} (best earlier {r['best']:.3f} "
                         f"at {r['best_stage']}; {r['fraction']:.0%} of the gap closed)")
    return "\n".join(lines) + ("\n" if lines else "")

"""Build the SFT mix and one RL set per domain, each with a held-out validation split.

An RL row that breaks its verifier's contract (:func:`contract_reason`: ``ground_truth`` not
strict JSON, a required key missing or of the wrong type, an unknown instruction id...) never
reaches a set: it is rejected with reason ``verifier_contract: <agent_ref>: <detail>``.

Selection is deterministic: rows are ranked by ``md5(seed + uuid)`` (as two unsigned 64-bit halves, the
order of the hex digest); the first
``validation_rows`` of each group form the validation split, and per-group
caps (``max_rows``) keep the lowest-ranked rows. Rows a cap leaves out are
rejected with reason ``mix_cap`` so the counts balance. RL sets exist only for
domains that have rows (no empty placeholder sets).

:func:`build_sets` decides on frames in memory; the ``build`` step decides the same out of core on its keys
(:mod:`curation.build_plan`, with this module's :func:`group_counts` and :func:`mix_draws`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import polars as pl

from common.text import md5_halves, md5_hex

if TYPE_CHECKING:
    from curation.params import BuildParams


def rank_batch(df: pl.DataFrame, seed: int) -> pl.DataFrame:
    """``df`` plus ``_rank`` = ``md5(f"{seed}:{uuid}")`` as a struct of its high and low 64 bits (UInt64
    ``hi``, ``lo``: 16 bytes a row, sorted as the hex digest is): the per-row part of ``build``, mapped over
    the decontaminated tables by the executor."""
    return df.with_columns(md5_halves(md5_hex(df["uuid"], f"{seed}:")).alias("_rank"))


CONTRACT = "_contract"  # the column of :func:`contract_batch`: why a row breaks its verifier's contract


def contract_reason(row: dict[str, Any]) -> str | None:
    """None when the RL ``row`` meets its verifier's contract
    (:func:`validators.verifiers.registry.check_row`: known ``agent_ref``, strict-JSON fields, the
    verifier's ground-truth keys and types), else the reject reason ``verifier_contract: <agent_ref>: ...``."""
    from validators.verifiers.registry import check_row

    try:
        check_row(row)
    except ValueError as exc:
        detail = str(exc).removeprefix(f"row {row.get('uuid')!r}: ")
        return f"verifier_contract: {row.get('agent_ref')}: {detail}"
    return None


def contract_batch(df: pl.DataFrame, seed: int) -> pl.DataFrame:
    """:func:`rank_batch` of RL rows plus :data:`CONTRACT` (:func:`contract_reason` of each row, null
    when it passes): the per-row part of ``build`` on the RL table, mapped by the executor."""
    reasons = [contract_reason(row) for row in df.to_dicts()]
    return rank_batch(df, seed).with_columns(pl.Series(CONTRACT, reasons, dtype=pl.String))


SFT_VALIDATION_FRACTION = 0.1  # an SFT source's validation split is at most this share of its kept rows
KEYS = ("source", "domain", "_rank")  # what build decides on: the rows follow by position in the file


def key_batch(df: pl.DataFrame, seed: int, kind: str) -> pl.DataFrame:
    """The map of ``build`` over a ``kind`` table: :data:`KEYS` of each row (and ``agent_ref`` and
    :data:`CONTRACT` for RL rows, :func:`contract_batch`), strings as categoricals (the step writes them to
    scratch: :func:`curation.build_plan.key_frames`)."""
    keys = (contract_batch(df, seed).select(*KEYS, "agent_ref", CONTRACT) if kind == "rl"
            else rank_batch(df, seed).select(KEYS))
    return keys.with_columns(pl.col(pl.String).cast(pl.Categorical))


def _rank(df: pl.DataFrame, seed: int) -> tuple[pl.DataFrame, list[str]]:
    """``df`` sorted by its seeded rank (the ``_rank`` column of :func:`rank_batch`, computed when absent),
    and the columns to drop from what is made of it: ``_rank`` when it was computed here (a given one is kept,
    so a set split from keys can be drawn into a mix without its uuids)."""
    if "_rank" in df.columns:
        return df.sort("_rank"), []
    return rank_batch(df, seed).sort("_rank"), ["_rank"]


def group_counts(rows: int, validation_rows: int, max_rows: int | None, max_fraction: float) -> tuple[int, int]:
    """(rows kept, of which validation) of a group of ``rows``: ``max_rows`` bounds train + validation and
    validation takes at most ``validation_rows`` and ``max_fraction`` of the kept rows (:func:`split_group`;
    the out-of-core build, :mod:`curation.build_plan`, applies the same counts to its ranks)."""
    keep = rows if max_rows is None else min(max_rows, rows)
    return keep, min(validation_rows, int(keep * max_fraction))


def mix_draws(weights: dict[str, float], total: int, sizes: dict[str, tuple[int, int]]
              ) -> tuple[dict[str, tuple[int, int]], dict[str, Any]]:
    """What a mix of ``total`` train rows in the proportions ``weights`` draws from the domain sets of
    ``sizes[domain]`` = (train rows, validation rows): (train, validation) rows from each domain with a set
    (``round(total * weight)`` train rows or all it has, and validation rows in the same proportion), and
    the mix's stats per domain (``wanted``, ``train``, ``validation``, ``shortfall``; ``no_set`` for a domain
    without a set). Shared by :func:`draw_mix` and the out-of-core build (:mod:`curation.build_plan`).

    Raises:
        ValueError: when the weights do not sum to 1.
    """
    if abs(sum(weights.values()) - 1.0) > 1e-6:
        raise ValueError(f"mix weights {weights} sum to {sum(weights.values())}, not 1")
    draws: dict[str, tuple[int, int]] = {}
    stats: dict[str, Any] = {}
    for domain, w in weights.items():
        want = round(total * w)
        if domain not in sizes:  # no row of the domain in this data (NVIDIA's release has no tool_use)
            stats[domain] = {"wanted": want, "train": 0, "validation": 0, "shortfall": want, "no_set": True}
            continue
        train_rows, validation_rows = sizes[domain]
        n_train = min(want, train_rows)
        draws[domain] = n_train, min(round(validation_rows * want / max(train_rows, 1)), validation_rows)
        stats[domain] = {"wanted": want, "train": n_train, "validation": draws[domain][1],
                         "shortfall": max(want - n_train, 0)}
    return draws, stats


def split_group(df: pl.DataFrame, validation_rows: int, max_rows: int | None,
                seed: int, max_fraction: float = 0.1) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """Split one group into (train, validation, capped) by the seeded rank.

    ``validation_rows`` is capped at ``max_fraction`` of the group (a tenth by default) so small
    groups keep most rows for training. ``max_rows`` bounds train + validation. The parts have ``df``'s
    columns (a ``_rank`` it lacked is computed and not returned).
    """
    ranked, extra = _rank(df, seed)
    n_keep, n_val = group_counts(len(ranked), validation_rows, max_rows, max_fraction)
    keep, capped = ranked.head(n_keep), ranked.slice(n_keep).drop(extra)
    return keep.slice(n_val).drop(extra), keep.head(n_val).drop(extra), capped


def build_sets(sft: pl.DataFrame, rl: pl.DataFrame, params: BuildParams
               ) -> tuple[dict[str, dict[str, pl.DataFrame]], list[pl.DataFrame], dict[str, Any]]:
    """Build every set.

    Args:
        sft, rl: decontaminated canonical tables, with or without the ``_rank`` column of
            :func:`rank_batch` (the executor's map computes it; the same value is computed here if absent).
        params: the ``build`` block (:class:`curation.params.BuildParams`): ``seed``,
            ``sft_validation_rows``, ``rl_validation_rows`` (at most ``rl_validation_fraction`` of a
            domain), ``sft_max_rows_per_source`` {source: cap}, ``rl_max_rows_per_domain`` {domain: cap},
            ``mixes``.

    Returns:
        (sets, capped, stats): ``sets[name][split]`` with names ``sft`` and
        ``rl/<domain>``; ``capped``: frames of rows left out by a cap, with a ``reason``
        column; per-set counts.
    """
    seed = params.seed
    sets: dict[str, dict[str, list[pl.DataFrame]]] = {}
    capped: list[pl.DataFrame] = []

    def add(name: str, group: pl.DataFrame, val_rows: int, cap: int | None, fraction: float = 0.1) -> None:
        train, val, cut = split_group(group, val_rows, cap, seed, fraction)
        parts = sets.setdefault(name, {"train": [], "validation": []})
        parts["train"].append(train)
        parts["validation"].append(val)
        capped.append(cut.with_columns(pl.lit(f"mix_cap: {name} cap {cap}").alias("reason")))

    sft_caps = params.sft_max_rows_per_source
    for (source,), group in sft.group_by("source", maintain_order=True):
        add("sft", group, params.sft_validation_rows, sft_caps.get(source), SFT_VALIDATION_FRACTION)
    rl_caps = params.rl_max_rows_per_domain
    for (domain,), group in rl.sort("domain", maintain_order=True).group_by("domain", maintain_order=True):
        add(f"rl/{domain}", group, params.rl_validation_rows, rl_caps.get(domain), params.rl_validation_fraction)

    out = {name: {split: pl.concat(frames) for split, frames in parts.items()} for name, parts in sets.items()}
    stats = {name: {split: len(df) for split, df in splits.items()} for name, splits in out.items()}
    mixes, mix_stats = {}, {}
    for name, spec in params.mixes.items():
        mixes[f"rl/{name}"], mix_stats[name] = draw_mix(out, spec.weights, spec.total, seed)
    return {**out, **mixes}, [c for c in capped if len(c)], {"sets": stats, "mixes": mix_stats}


def draw_mix(sets: dict[str, dict[str, pl.DataFrame]], weights: dict[str, float], total: int,
             seed: int) -> tuple[dict[str, pl.DataFrame], dict[str, Any]]:
    """A stage mix drawn from the per-domain RL sets in the given proportions.

    ``round(total * weight)`` rows come from each domain's train split (and
    proportionally from its validation split), lowest seeded rank first; a
    domain with fewer rows gives all it has and the shortfall is reported, a domain without a set
    (no row of it in the data; the names are checked against the installed domains with the params)
    gives none and is reported with ``no_set``.
    The paper's mixes: multi-domain RL = MCQ 55 %, tools 30 %, structured 15 %;
    MOPD = math 30 %, IF 30 %, tools 10 %, STEM 15 %, structured 15 % (recipe.md).

    Raises:
        ValueError: when the weights do not sum to 1.
    """
    sizes = {d: (len(sets[f"rl/{d}"]["train"]), len(sets[f"rl/{d}"]["validation"])) for d in weights
             if f"rl/{d}" in sets}
    draws, stats = mix_draws(weights, total, sizes)
    splits: dict[str, list[pl.DataFrame]] = {"train": [], "validation": []}
    for domain, (n_train, n_val) in draws.items():
        for split, n in (("train", n_train), ("validation", n_val)):
            ranked, extra = _rank(sets[f"rl/{domain}"][split], seed)
            splits[split].append(ranked.head(n).drop(extra))
    return {k: pl.concat(v) for k, v in splits.items()}, stats

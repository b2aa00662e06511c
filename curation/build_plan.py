"""Build's decisions out of core: the step's keys on disk, ranked in DuckDB, each set a take plan.

:func:`curation.build.build_sets` decides in memory on whole frames; the ``build`` step decides the same
on the keys of :func:`curation.build.key_batch`, written to scratch with each row's position (``pos``), so
its memory does not grow with the rows:

- per kind, the groups (SFT: by ``source``, in order of first appearance; RL: rows meeting their
  verifier's contract, by ``domain`` in lexical order) and their sizes, a row per group;
- each row's place in its group by the seeded rank (``row_number() OVER (PARTITION BY group ORDER BY
  rank)``, ties by position as polars' stable sort), written to a parquet file by DuckDB under its memory
  limit (:func:`common.io.spill_db`);
- the counts of each group's splits and each mix's draws from the group sizes alone
  (:func:`curation.build.group_counts`, :func:`curation.build.mix_draws`: the functions of the in-memory
  build), as spans of ranks;
- per output (a set's split, or the rejects of a cap or of the contract), a take plan: the positions of
  its rows in the input file, sorted by position, and their place in the output
  (:func:`common.take.take_plan` reads it beside the input, a batch of each at a time).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
import pyarrow as pa

from curation.build import CONTRACT, SFT_VALIDATION_FRACTION, group_counts, mix_draws

if TYPE_CHECKING:
    from curation.params import BuildParams

KEY_COLUMNS = {"pos": pa.int64(), "source": pa.string(), "domain": pa.string(), "hi": pa.uint64(),
               "lo": pa.uint64()}
RL_KEY_COLUMNS = {"agent_ref": pa.string(), CONTRACT: pa.string()}


def key_schema(kind: str) -> pa.Schema:
    """The schema of a ``kind`` keys file: position, source, domain, the rank's two halves (and for RL rows
    ``agent_ref`` and the contract reason, null when the row meets it)."""
    return pa.schema({**KEY_COLUMNS, **(RL_KEY_COLUMNS if kind == "rl" else {})})


def key_frames(frames: Iterable[pl.DataFrame]) -> Iterator[pl.DataFrame]:
    """The frames of :func:`curation.build.key_batch` mapped over a file, in order, as a keys file's rows
    (:func:`key_schema`): ``pos`` counted across them, strings as strings, the rank's halves as columns."""
    first = 0
    for frame in frames:
        yield (frame.with_columns(pl.col(pl.Categorical).cast(pl.String)).unnest("_rank")
               .with_columns(pl.int_range(first, first + len(frame), dtype=pl.Int64).alias("pos")))
        first += len(frame)


@dataclass
class Take:
    """One output of the plan: the rows of ``kind``'s input file the plan file ``plan`` places, as arrow
    chunks of ``chunks`` rows (one per group, or per domain of a mix: what the in-memory build writes)."""

    kind: str
    plan: Path
    chunks: list[int]

    @property
    def rows(self) -> int:
        """Rows of the output."""
        return sum(self.chunks)


@dataclass
class BuildPlan:
    """What ``build`` writes: ``sets[name][split]`` (names ``sft``, ``rl/<domain>``, then the mixes
    ``rl/<mix>``), the ``rejects`` in order (contract breakers, then each capped group's rows, with a
    ``reason`` column), the ``stats`` of :func:`curation.build.build_sets`, the rows in and the contract
    rejects by verifier."""

    sets: dict[str, dict[str, Take]] = field(default_factory=dict)
    rejects: list[Take] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    rows_in: int = 0
    by_verifier: dict[str, int] = field(default_factory=dict)


@dataclass
class _Group:
    kind: str
    gid: int
    name: str
    rows: int
    keep: int
    validation: int


def plan_build(keys: dict[str, Path], params: BuildParams, work: Path, db: Any) -> BuildPlan:
    """Plan every set of ``build`` from the keys files ``keys[kind]`` (:func:`key_schema`; ``kind`` in sft,
    rl), writing the ranks and the take plans into ``work``, with the DuckDB connection ``db``.

    Raises:
        ValueError: a mix's weights do not sum to 1.
    """
    plan = BuildPlan()
    groups: list[_Group] = []
    for kind, grp, where, order in (("sft", "source", "TRUE", "first"),
                                    ("rl", "domain", f"{CONTRACT} IS NULL", "grp NULLS FIRST")):
        src = {"keys": str(keys[kind])}
        plan.rows_in += _query(db, "SELECT count(*) FROM read_parquet($keys)", src)[0][0]
        found = pl.from_arrow(db.sql(f"""SELECT {grp} AS grp, min(pos) AS first, count(*) AS n
                                         FROM read_parquet($keys) WHERE {where} GROUP BY ALL ORDER BY {order}""",
                                     params=src).to_arrow_table())
        db.register(f"groups_{kind}", found.with_row_index("gid").to_arrow())
        _query(db, f"""COPY (SELECT k.pos, g.gid, row_number() OVER (PARTITION BY g.gid ORDER BY k.hi, k.lo, k.pos) - 1
                                    AS r
                             FROM read_parquet($keys) k JOIN groups_{kind} g ON k.{grp} IS NOT DISTINCT FROM g.grp
                             WHERE {where}) TO '{work}/ranked_{kind}.parquet' (FORMAT parquet)""", src)
        for gid, (name, n) in enumerate(found.select("grp", "n").iter_rows()):
            if kind == "sft":
                counts = group_counts(n, params.sft_validation_rows, params.sft_max_rows_per_source.get(name),
                                      SFT_VALIDATION_FRACTION)
            else:
                counts = group_counts(n, params.rl_validation_rows, params.rl_max_rows_per_domain.get(name),
                                      params.rl_validation_fraction)
            groups.append(_Group(kind, gid, "sft" if kind == "sft" else f"rl/{name}", n, *counts))
    spans: dict[str, dict[str, list[tuple[_Group, int, int]]]] = {}
    for g in groups:
        splits = spans.setdefault(g.name, {"train": [], "validation": []})
        splits["train"].append((g, g.validation, g.keep))
        splits["validation"].append((g, 0, g.validation))
    plan.stats["sets"] = {name: {split: sum(hi - lo for _, lo, hi in s) for split, s in splits.items()}
                          for name, splits in spans.items()}
    plan.stats["mixes"] = {}
    for mix, spec in params.mixes.items():
        drawn, plan.stats["mixes"][mix] = _draw(groups, spec.weights, spec.total)
        spans[f"rl/{mix}"] = drawn
    for name, splits in spans.items():
        plan.sets[name] = {split: _take(db, work, f"{name}/{split}", s) for split, s in splits.items()}
    plan.rejects.append(_broken(db, work, keys["rl"]))
    plan.rejects += [_take(db, work, f"capped/{g.kind}-{g.gid}", [(g, g.keep, g.rows)],  # a plan per group
                           f"mix_cap: {g.name} cap {g.keep}") for g in groups if g.rows > g.keep]
    verifiers = _query(db, f"SELECT agent_ref, count(*) FROM read_parquet($keys) WHERE {CONTRACT} IS NOT NULL "
                           "GROUP BY ALL", {"keys": str(keys["rl"])})
    plan.by_verifier = dict(sorted(verifiers))
    return plan


def _draw(groups: list[_Group], weights: dict[str, float], total: int
          ) -> tuple[dict[str, list[tuple[_Group, int, int]]], dict[str, Any]]:
    """The spans of a mix (:func:`curation.build.mix_draws` of the domain groups: the first ranks of each
    domain's train and validation splits) and its stats."""
    by_domain = {g.name.removeprefix("rl/"): g for g in groups if g.kind == "rl"}
    draws, stats = mix_draws(weights, total, {d: (g.keep - g.validation, g.validation) for d, g in by_domain.items()})
    return ({"train": [(by_domain[d], by_domain[d].validation, by_domain[d].validation + t) for d, (t, _) in draws.items()],
             "validation": [(by_domain[d], 0, v) for d, (_, v) in draws.items()]}, stats)


def _take(db: Any, work: Path, name: str, spans: list[tuple[_Group, int, int]], reason: str | None = None) -> Take:
    """The take plan of the rows ranked ``lo`` to ``hi`` - 1 in each span's group, the spans one after another
    (with a ``reason`` column when given)."""
    kinds = {g.kind for g, _, _ in spans}
    kind = kinds.pop() if kinds else "rl"
    chunks = [hi - lo for _, lo, hi in spans]
    table = pa.table({"gid": [g.gid for g, _, _ in spans], "lo": [lo for _, lo, hi in spans],
                      "hi": [hi for _, lo, hi in spans], "base": [sum(chunks[:i]) for i in range(len(spans))]},
                     schema=pa.schema({"gid": pa.uint32(), "lo": pa.int64(), "hi": pa.int64(), "base": pa.int64()}))
    db.register("spans", table)
    path = work / f"{name.replace('/', '.')}.plan.parquet"
    extra = ", $reason AS reason" if reason is not None else ""
    _query(db, f"""COPY (SELECT r.pos, s.base + r.r - s.lo AS out{extra}
                         FROM read_parquet($ranked) r JOIN spans s ON r.gid = s.gid AND r.r >= s.lo AND r.r < s.hi
                         ORDER BY r.pos) TO '{path}' (FORMAT parquet)""",
           {"ranked": str(work / f"ranked_{kind}.parquet"), **({"reason": reason} if reason is not None else {})})
    db.unregister("spans")
    return Take(kind, path, chunks)


def _broken(db: Any, work: Path, keys: Path) -> Take:
    """The take plan of the RL rows that break their verifier's contract, in file order, with their reason."""
    path = work / "broken.plan.parquet"
    _query(db, f"""COPY (SELECT pos, row_number() OVER (ORDER BY pos) - 1 AS out, {CONTRACT} AS reason
                         FROM read_parquet($keys) WHERE {CONTRACT} IS NOT NULL ORDER BY pos)
                   TO '{path}' (FORMAT parquet)""", {"keys": str(keys)})
    n = _query(db, "SELECT count(*) FROM read_parquet($p)", {"p": str(path)})[0][0]
    return Take("rl", path, [n])


def _query(db: Any, sql: str, params: dict[str, Any]) -> list[tuple]:
    """Every row of ``sql`` run on ``db`` with the named ``params`` (``$name``); the result is fetched whole, so
    the connection is free for the next statement (a COPY returns one row, its count)."""
    return db.execute(sql, params).fetchall()

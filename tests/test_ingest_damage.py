"""Ingest on damaged source files (#21): every damaged record is a reject naming the file, the record
and the field (or the step fails naming the source and file); the good records around it come out
exactly as they do from an intact file, and ``records_in == records_mapped + records_rejected``.

Small files written to ``tmp_path`` in the sources' own shapes (ShareGPT elements, Arena-Hard answers,
oe-eval requests); the truncated gzip is the real ``HumanEval.jsonl.gz`` of the default registry.
"""

from __future__ import annotations

import gzip
import json
import tracemalloc
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

import curation.ingest
from common.io import Rejects
from corpora.readers import SourceError, read_records
from corpora.registry import SourceSpec, load_registry
from curation.ingest import ingest_source, run_ingest, source_root
from curation.params import check_params

REPO = Path(__file__).resolve().parents[1]

SHAREGPT = [  # the first turns of three ShareGPT-V3 conversations, shortened
    {"id": "QWJhYvA_0", "conversations": [
        {"from": "human", "value": "Summarize the main ideas of Jeff Walker's Product Launch Formula into bullet "
                                   "points as it pertains to a growth marketing agency."},
        {"from": "gpt", "value": "1. Pre-launch: build anticipation with valuable content.\n2. Launch: open the "
                                 "cart for a limited time.\n3. Post-launch: follow up and deliver."}]},
    {"id": "i6IyJda_0", "conversations": [
        {"from": "human", "value": "Write a short menu for a café in Lyon, in French."},
        {"from": "gpt", "value": "Café crème — 3 €\nCroissant au beurre — 2 €\nQuiche lorraine — 7 €"}]},
    {"id": "A5AbcES_0", "conversations": [
        {"from": "human", "value": "How to tell if a customer segment is well segmented? In 3 bullet points."},
        {"from": "gpt", "value": "1. Homogeneity within the segment.\n2. Distinctiveness from other segments.\n"
                                 "3. Reachability through a channel."}]},
]

ANSWER = {"uid": "0253f09025cc40cd", "ans_id": "dgYCTvj3bz42JVPxnkZNB2", "model": "o3-mini-2025-01-31",
          "messages": [{"role": "user", "content": "Which AWS gateway lets private subnets reach IPv6 APIs "
                                                   "without allowing inbound traffic?"},
                       {"role": "assistant", "content": {"answer": "An egress-only internet gateway."}}]}

GSM8K_DOC = {"question": "A robe takes 2 bolts of blue fiber and half that much white fiber.  How many bolts in "
                         "total does it take?",
             "answer": "It takes 2/2=<<2/2=1>>1 bolt of white fiber\n#### 3", "short_answer": "3", "id": 1}


def _spec(path: Path | str, fmt: str, adapter: str, name: str = "damaged", output: str = "sft",
          role: str = "train", domain: str = "chat", **extra: Any) -> SourceSpec:
    return SourceSpec(name=name, kind="local", path=str(path), format=fmt, adapter=adapter, output=output,
                      domain=domain, role=role, license="MIT", **extra)


def _ingest(spec: SourceSpec, max_bytes: int | None = None) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """(rows, [(record_id, reason)]) of ``spec``, with the per-source balance checked."""
    rejects = Rejects("ingest")
    kwargs = {} if max_bytes is None else {"max_record_bytes": max_bytes}
    result = ingest_source(spec, Path.cwd(), rejects, **kwargs)
    assert result.records_in == result.records_mapped + len(rejects)
    return result.rows, [(r["record_id"], r["reason"]) for r in rejects.rows]


def _jsonl(path: Path, records: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def _json(path: Path, records: list[Any]) -> Path:
    path.write_text(json.dumps(records, ensure_ascii=False, indent=2), encoding="utf-8")
    return path


# ---------------------------------------------------------------- 1. a truncated .gz
def test_truncated_gzip_keeps_every_complete_line_and_rejects_the_tail(tmp_path, sources_cache):
    spec = next(s for s in load_registry() if s.name == "humaneval")
    real = next(Path(source_root(spec, sources_cache)).glob(spec.path))
    cut = tmp_path / "HumanEval.jsonl.gz"
    cut.write_bytes(real.read_bytes()[: real.stat().st_size // 2])
    whole, _ = _ingest(spec.model_copy(update={"kind": "local", "path": str(real)}))
    rows, rejects = _ingest(spec.model_copy(update={"kind": "local", "path": str(cut)}))
    kept = len(rows)
    assert 0 < kept < 164
    assert rows == whole[:kept]  # the complete lines before the cut, unchanged (uuids included)
    assert rejects == [(f"HumanEval.jsonl.gz:{kept + 1}",
                        f"truncated file: HumanEval.jsonl.gz breaks off in line {kept + 1} "
                        "(Compressed file ended before the end-of-stream marker was reached)")]


def test_a_file_that_is_not_gzip_is_one_reject_naming_it(tmp_path):
    bad = tmp_path / "HumanEval.jsonl.gz"
    bad.write_bytes(b'{"task_id": "HumanEval/0"}\n')  # plain text under a .gz name
    rows, rejects = _ingest(_spec(bad, "jsonl.gz", "humaneval", output="rl", role="benchmark", domain="code"))
    assert rows == []
    assert rejects == [("HumanEval.jsonl.gz:1",
                        "corrupt file: HumanEval.jsonl.gz breaks off in line 1 (Not a gzipped file (b'{\"'))")]


# ---------------------------------------------------------------- 2. records of the wrong type
@pytest.mark.parametrize("fmt", ["jsonl", "json", "json_stream"])
def test_a_record_that_is_a_json_array_is_rejected_and_its_neighbours_kept(tmp_path, fmt):
    records = [SHAREGPT[0], [SHAREGPT[1]], SHAREGPT[2]]
    write = _jsonl if fmt == "jsonl" else _json
    path = write(tmp_path / f"sharegpt.{fmt}", records)
    (tmp_path / "clean").mkdir()
    clean = write(tmp_path / "clean" / path.name, SHAREGPT)
    rows, rejects = _ingest(_spec(path, fmt, "sharegpt"))
    good, _ = _ingest(_spec(clean, fmt, "sharegpt"))
    rid = f"sharegpt.{fmt}:2" if fmt == "jsonl" else f"sharegpt.{fmt}:1"
    assert rejects == [(rid, "invalid record: <record>: expected an object, got list")]
    assert rows == [good[0], good[2]]


@pytest.mark.parametrize(("adapter", "output", "domain", "record", "reason"), [
    ("arena_hard_answer", "sft", "chat", {**ANSWER, "messages": "Which AWS gateway?"},
     "messages: expected a list of objects, got str"),
    ("arena_hard_answer", "sft", "chat", {**ANSWER, "messages": ["Which AWS gateway?"]},
     "messages[0]: expected an object, got str"),
    ("sharegpt", "sft", "chat", {"id": "x_0", "conversations": "human: hi"}, "conversations: expected a list"),
    ("healthbench", "rl", "rlhf", {"prompt_id": "p1", "prompt": "I have a headache", "rubrics": []},
     "prompt: expected a list of objects, got str"),
    ("mmlu", "rl", "stem_mcqa", {"question": "2 + 2?", "subject": "math", "choices": "ABCD", "answer": 0},
     "choices: expected a list, got str"),  # was four one-letter options
    ("mtbench", "rl", "rlhf", {"question_id": 81, "turns": ["Write a haiku."], "reference": "any haiku"},
     "reference: expected a list (one per turn), got str"),  # was the reference's first letter
    ("mbpp_problem", "rl", "code", {"task_id": 2, "text": "Add two numbers.", "test_list": [1, 2]},
     "test_list: expected a non-empty list of strings"),
    ("bfcl", "rl", "tool_calling", {"id": "irrelevance_0", "question": [[{"role": "user", "content": "Hi"}]],
                                    "function": {"name": "f"}},
     "function: expected a list of objects, got dict"),
])
def test_a_field_of_the_wrong_type_is_a_reject_naming_it(tmp_path, adapter, output, domain, record, reason):
    path = _jsonl(tmp_path / "records.jsonl", [ANSWER, record] if adapter == "arena_hard_answer" else [record])
    rows, rejects = _ingest(_spec(path, "jsonl", adapter, output=output, domain=domain))
    line = 2 if adapter == "arena_hard_answer" else 1
    assert rejects == [(f"records.jsonl:{line}", f"invalid record: {reason}")]
    assert len(rows) == line - 1
    if rows:
        assert rows[0]["messages"][1]["content"] == "An egress-only internet gateway."


# ---------------------------------------------------------------- 3. records missing their id
def test_oe_eval_requests_without_doc_id_are_rejected_not_folded_together(tmp_path):
    path = tmp_path / "gsm8k" / "gold_bpb_5shot" / "requests.jsonl.gz"
    path.parent.mkdir(parents=True)
    doc0 = {**GSM8K_DOC, "id": 0, "question": "Janet's ducks lay 16 eggs per day. How many are left after 7?",
            "short_answer": "9"}
    requests = [
        {"request_type": "generate_until", "doc": doc0, "doc_id": 0, "idx": 0},
        {"request_type": "loglikelihood", "doc": doc0, "doc_id": 0, "idx": 1},  # the same item again
        {"request_type": "generate_until", "doc": {**GSM8K_DOC, "id": 7}, "idx": 0},  # no doc_id
        {"request_type": "generate_until", "doc": {**GSM8K_DOC, "id": 8}, "idx": 0},  # no doc_id either
        {"request_type": "generate_until", "doc": GSM8K_DOC, "doc_id": 1, "idx": 0},
        {"request_type": "loglikelihood", "doc": {**GSM8K_DOC, "short_answer": "4"}, "doc_id": 1, "idx": 1},
        {"request_type": "generate_until", "doc_id": 2, "idx": 0},  # no doc
        ["generate_until", doc0],
    ]
    path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in requests).encode()))
    rows, rejects = _ingest(_spec(path, "olmo_requests", "gsm8k", output="rl", role="benchmark", domain="math"))
    assert [json.loads(r["ground_truth"])["answer"] for r in rows] == ["9", "3"]
    assert [json.loads(r["metadata"])["id"] for r in rows] == [0, 1]
    assert rejects == [
        ("gsm8k:requests.jsonl.gz:3", "invalid record: doc_id: missing"),
        ("gsm8k:requests.jsonl.gz:4", "invalid record: doc_id: missing"),
        ("gsm8k:requests.jsonl.gz:6", "invalid record: doc: differs from the doc of the first request with "
                                      "doc_id 1 (gsm8k:requests.jsonl.gz:5)"),
        ("gsm8k:requests.jsonl.gz:7", "invalid record: doc: missing"),
        ("gsm8k:requests.jsonl.gz:8", "invalid record: <record>: expected an object, got list"),
    ]


# ---------------------------------------------------------------- 4. invalid UTF-8 in the ShareGPT stream
def test_invalid_utf8_rejects_its_element_and_the_stream_reads_on(tmp_path):
    damaged = tmp_path / "ShareGPT_V3_unfiltered_cleaned_split.json"
    (tmp_path / "clean").mkdir()
    clean = _json(tmp_path / "clean" / damaged.name, SHAREGPT)
    damaged.write_bytes(clean.read_bytes().replace("café".encode(), b"caf\xe9", 1))  # a Latin-1 byte in element 1
    rows, rejects = _ingest(_spec(damaged, "json_stream", "sharegpt"))
    good, _ = _ingest(_spec(clean, "json_stream", "sharegpt"))
    element = json.dumps(SHAREGPT[1], ensure_ascii=False, indent=2).replace("\n", "\n  ").encode()
    offset = element.index("café".encode()) + 3
    assert rejects == [("ShareGPT_V3_unfiltered_cleaned_split.json:1",
                        f"non-UTF-8 bytes: byte {offset} of the record (invalid continuation byte)")]
    assert rows == [good[0], good[2]]  # the elements around it, unchanged (uuids included)
    assert not any("\ufffd" in m["content"] for r in rows for m in r["messages"])


def test_a_stream_cut_after_a_comma_still_reports_the_cut(tmp_path):
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(SHAREGPT[:2], indent=2)[:-2] + ",\n", encoding="utf-8")  # "...}," then EOF
    rows, rejects = _ingest(_spec(path, "json_stream", "sharegpt"))
    assert len(rows) == 2
    assert rejects == [("sharegpt.json:2", "truncated file: the file ends after element 1, before the array's "
                                           "closing bracket")]


# ---------------------------------------------------------------- 5. sources that yield no rows
@pytest.fixture
def two_sources(tmp_path, monkeypatch):
    """A ShareGPT train file and a HumanEval benchmark file (written by the test)."""
    monkeypatch.chdir(tmp_path)
    train = _spec(_json(tmp_path / "sharegpt.json", SHAREGPT), "json", "sharegpt", name="chat")
    bench = _spec(tmp_path / "HumanEval.jsonl", "jsonl", "humaneval", name="humaneval_local", output="rl",
                  role="benchmark", domain="code")
    return train, bench


@pytest.mark.parametrize(("content", "reasons"), [
    ("", "empty file: 1"), ("\n\n", "empty file: 1"), ("[]\n", "invalid record: 1")])
def test_a_benchmark_without_rows_fails_ingest_naming_it(two_sources, tmp_path, content, reasons):
    train, bench = two_sources
    Path(bench.path).write_text(content, encoding="utf-8")
    with pytest.raises(SourceError) as err:
        run_ingest([train, bench], tmp_path, tmp_path / "ingested", root=tmp_path)
    assert str(err.value).startswith(
        f"ingest: source 'humaneval_local' (benchmark, jsonl {bench.path}) yielded no rows: 1 records read, "
        f"1 rejected ({reasons}). Fix the files, or mark a source `optional: true`")
    assert not (tmp_path / "ingested").exists() and not (tmp_path / "metrics").exists()  # nothing written


def test_an_optional_empty_source_passes_with_a_warning(two_sources, tmp_path, capsys):
    train, bench = two_sources
    Path(bench.path).write_text("", encoding="utf-8")
    metrics = run_ingest([train, bench.model_copy(update={"optional": True})], tmp_path, tmp_path / "ingested",
                         root=tmp_path)
    assert metrics["per_source"] == {
        "chat": {"records_in": 3, "records_mapped": 3, "rows_out": 3, "records_rejected": 0},
        "humaneval_local": {"records_in": 1, "records_mapped": 0, "rows_out": 0, "records_rejected": 1}}
    assert "WARNING source 'humaneval_local' (benchmark, jsonl" in capsys.readouterr().err
    assert pq.read_table(tmp_path / "ingested" / "benchmarks.parquet").num_rows == 0
    rejects = pq.read_table(tmp_path / "rejects" / "ingest.parquet").to_pylist()
    assert [(r["source"], r["record_id"], r["reason"]) for r in rejects] == [
        ("humaneval_local", "HumanEval.jsonl", "empty file: HumanEval.jsonl holds no records")]


def test_the_registry_field_optional_defaults_to_false(tmp_path):
    registry = yaml.safe_load((REPO / "corpora" / "sources.yaml").read_text(encoding="utf-8"))
    registry["sources"][0]["optional"] = True
    path = tmp_path / "sources.yaml"
    path.write_text(yaml.safe_dump(registry), encoding="utf-8")
    specs = load_registry(path, include_disabled=True)
    assert [s.optional for s in specs[:2]] == [True, False]


# ---------------------------------------------------------------- 6. records above ingest.max_record_bytes
def test_records_above_the_size_limit_are_rejected_unread(tmp_path):
    big = {**ANSWER, "ans_id": "big", "messages": [ANSWER["messages"][0],
                                                   {"role": "assistant", "content": {"answer": "x" * 10_000}}]}
    path = _jsonl(tmp_path / "o3-mini.jsonl", [ANSWER, big, ANSWER])
    size = len(json.dumps(big, ensure_ascii=False).encode())
    rows, rejects = _ingest(_spec(path, "jsonl", "arena_hard_answer"), max_bytes=4096)
    whole, _ = _ingest(_spec(path, "jsonl", "arena_hard_answer"))
    assert rejects == [("o3-mini.jsonl:2", f"record too large: {size:,} bytes > ingest.max_record_bytes 4,096")]
    assert rows == [whole[0], whole[2]]


@pytest.mark.parametrize("fmt", ["json_stream", "parquet"])
def test_elements_and_arrow_rows_above_the_size_limit_are_rejected(tmp_path, fmt):
    big = {"id": "big_0", "conversations": [{"from": "human", "value": "y" * 5000}, SHAREGPT[0]["conversations"][1]]}
    records = [SHAREGPT[0], big, SHAREGPT[2]]
    if fmt == "parquet":
        path = tmp_path / "sharegpt.parquet"
        pq.write_table(pa.Table.from_pylist(records), path)
        size = len(json.dumps(big, ensure_ascii=False).encode())
    else:
        path = _json(tmp_path / "sharegpt.json", records)
        size = len(json.dumps(big, ensure_ascii=False, indent=2).replace("\n", "\n  ").encode())
    rows, rejects = _ingest(_spec(path, fmt, "sharegpt"), max_bytes=4096)
    assert rejects == [(f"{path.name}:1", f"record too large: {size:,} bytes > ingest.max_record_bytes 4,096")]
    assert [json.loads(r["metadata"])["id"] for r in rows] == ["QWJhYvA_0", "A5AbcES_0"]


@pytest.mark.parametrize("fmt", ["jsonl", "json"])
def test_reading_past_a_huge_record_holds_only_a_bounded_part_of_it(tmp_path, fmt):
    """A 24 MB record under a 1 MiB limit: the reader allocates a few times the limit, never the record."""
    good = json.dumps(SHAREGPT[0])
    huge = '{"id": "huge", "conversations": [{"from": "human", "value": "' + "z" * (24 << 20) + '"}]}'
    path = tmp_path / f"big.{fmt}"
    path.write_text(f"{good}\n{huge}\n{good}\n" if fmt == "jsonl" else f"[{good},\n{huge},\n{good}]",
                    encoding="utf-8")
    tracemalloc.start()
    try:
        records = list(read_records(_spec(path, fmt, "sharegpt"), tmp_path, max_bytes=1 << 20))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [r.error is None for r in records] == [True, False, True]
    assert records[1].error == f"record too large: {len(huge):,} bytes > ingest.max_record_bytes 1,048,576"
    assert peak < 6 << 20, f"peak {peak:,} bytes"


def test_the_size_limit_is_a_checked_param():
    params = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
    assert params["ingest"]["max_record_bytes"] == 16 << 20
    check_params(params)
    with pytest.raises(ValueError, match=r"^params.yaml ingest.max_record_bytes: Input should be greater than or "
                                         r"equal to 1 \(got 0\)$"):
        check_params({**params, "ingest": {"max_record_bytes": 0}})
    with pytest.raises(ValueError, match=r"^params.yaml ingest.max_record_byte: unknown key \(did you mean "
                                         r"'max_record_bytes'\?\)$"):
        check_params({**params, "ingest": {"max_record_byte": 10}})


# ---------------------------------------------------------------- what cannot be a reject fails the step
def test_an_adapter_that_breaks_fails_naming_the_record(tmp_path, monkeypatch):
    def broken(raw, spec, root):
        return {"messages": raw["conversations"][5]}  # an IndexError, not a RecordError

    monkeypatch.setattr(curation.ingest, "get_adapter", lambda name: broken)
    path = _json(tmp_path / "sharegpt.json", SHAREGPT)
    with pytest.raises(SourceError, match=r"^source 'damaged': adapter 'sharegpt' broke on record sharegpt.json:0 "
                                          r"instead of rejecting it: IndexError: list index out of range$"):
        _ingest(_spec(path, "json", "sharegpt"))


def test_an_unreadable_file_fails_naming_the_source_and_file(tmp_path):
    path = tmp_path / "train-00000-of-00001.parquet"
    path.write_bytes(b"PAR1 not really parquet")
    with pytest.raises(SourceError, match=rf"^source 'damaged': cannot read {path} as parquet: ArrowInvalid: "):
        _ingest(_spec(path, "parquet", "sharegpt"))

"""NVIDIA's Cascade-2 releases carry their cards' licenses: the SFT rows the NVIDIA Open Model License
(not an open license: ``export`` refuses them unless ``export.allow_licenses`` lists it), the RL rows
ODC-By; the SFT release's ``terminal_agent`` config is an SFT domain of its own."""

from pathlib import Path

import polars as pl
import pyarrow as pa
import yaml

from corpora.adapters import get_adapter
from corpora.registry import COMMERCIAL_LICENSES, load_registry
from corpora.schema import SFT_DOMAINS, SFT_SCHEMA
from curation.ingest import finalize_row
from curation.release import export_release
from validators.dataset import run_suite

REPO = Path(__file__).resolve().parents[1]
SPECS = load_registry(REPO / "corpora" / "sources-hub.yaml")
NVIDIA = "nvidia-open-model-license"


def test_the_hub_registry_has_the_cards_licenses_and_a_terminal_agent_domain():
    sft = {s.name: s for s in SPECS if s.output == "sft"}
    assert len(sft) == 8 and all(n.startswith("cascade2_sft_") for n in sft)
    assert {s.license for s in sft.values()} == {NVIDIA}
    assert {s.license for s in SPECS if s.output == "rl" and s.role == "train"} == {"odc-by"}
    terminal = sft["cascade2_sft_terminal_agent"]
    assert (terminal.hf_config, terminal.domain, terminal.notes) == ("terminal_agent", "terminal_agent", "")
    assert {s.hf_config for s in sft.values()} == {s.domain for s in sft.values()}  # one config, one domain
    assert "terminal_agent" in SFT_DOMAINS and NVIDIA not in COMMERCIAL_LICENSES


def _ingested() -> pl.DataFrame:
    """One row per SFT source of the Hub registry, through the nemotron_sft adapter and ingest's completion."""
    rows = []
    for k, spec in enumerate(s for s in SPECS if s.output == "sft"):
        raw = {"uuid": f"up-{k}", "messages": [{"role": "user", "content": f"task {k}: list the files"},
                                               {"role": "assistant", "content": f"ls -la  # {k}"}]}
        rows.append(finalize_row(get_adapter(spec.adapter)(raw, spec, Path(".")), spec, f"up-{k}", 0))
    return pl.from_arrow(pa.Table.from_pylist(rows, schema=SFT_SCHEMA))


def test_terminal_agent_rows_ingest_and_validate_as_their_own_domain():
    df = _ingested()
    terminal = df.filter(pl.col("source") == "cascade2_sft_terminal_agent")
    assert terminal["domain"].to_list() == ["terminal_agent"] and terminal["license"].to_list() == [NVIDIA]
    report = run_suite(df, "sft", "sft")  # validate's suite: domain among SFT_DOMAINS
    assert report.success, report.failures


def _export(tmp_path, allow):
    df = _ingested()
    sets = {d: {"train": g} for (d,), g in df.group_by("domain", maintain_order=True)}
    return export_release(sets, "sft", tmp_path / "release", SPECS, {}, allow, rows_per_shard=5)


def test_export_refuses_nvidia_sft_rows_by_default_with_the_reason(tmp_path):
    refused, stats = _export(tmp_path, [])
    assert len(refused) == 8 and stats == {"configs": {}}
    assert set(refused["reason"]) == {f"license_refused: {NVIDIA} is not cleared for release"}
    assert not list((tmp_path / "release").glob("*/*.parquet"))


def test_export_releases_them_when_allow_licenses_lists_it(tmp_path):
    refused, stats = _export(tmp_path, [NVIDIA])
    assert len(refused) == 0
    assert stats["configs"] == {d: {"train": 1} for d in ("math", "science", "chat", "instruction_following",
                                                            "safety", "conversational_agent", "swe", "terminal_agent")}
    back = pl.read_parquet(tmp_path / "release" / "terminal_agent" / "train-00000-of-00001.parquet")
    assert back["source"].to_list() == ["cascade2_sft_terminal_agent"] and back["license"].to_list() == [NVIDIA]
    header = yaml.safe_load((tmp_path / "release" / "README.md").read_text().split("---")[1])
    # as NVIDIA's card: the Hub has no identifier for this license
    assert (header["license"], header["license_name"], header["license_details"]) == ("other", NVIDIA, NVIDIA)

"""Where the pipeline's data lives, relative to the repository root: the one place that names the
directories ``dvc.yaml`` declares (the data steps write them, :mod:`curation.pipeline`; the training
stages read the sets, :mod:`stages.datasets`)."""

from __future__ import annotations

from pathlib import Path

SOURCES = Path("data/sources")                  # fetched packages and their manifest.json
ASSETS = Path("data/assets")                    # models converted to HF directories
INGESTED = Path("data/ingested")                # {sft,rl,benchmarks}.parquet in the canonical schemas
SYNTHESIZED = Path("data/synthesized")          # verified teacher responses (SFT rows)
DEDUPED = Path("data/dedup")
MINHASH = Path("data/minhash")                  # near-dedup signatures
QUALITY = Path("data/quality")                  # rows that pass language ID and the quality filters; language.parquet
SEMDEDUPED = Path("data/semdedup")              # rows that survive semantic dedup
DECONTAM_INDEX = Path("data/decontam_index")
DECONTAMINATED = Path("data/decontaminated")
VALIDATED = Path("data/validated")              # the dataset suites' results, <kind>.json (validate's output)
SETS = Path("data/sets")                        # sft/, rl/<domain>/ and the stage mixes: {train,validation}.parquet
FILTERED = Path("data/filtered")                # difficulty-filtered copies of the RL sets + manifest.json
SWE = Path("data/swe")                          # SWE tasks and their repositories
TOKENIZED = Path("data/tokenized")
PACKED = Path("data/packed")
RELEASE = Path("release")                       # the Hub-layout releases (sft/, rl/)

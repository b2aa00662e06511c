"""Check every RL row of built sets against its verifier's contract (``check_row``): counts per set
file and verifier, and each distinct failing row with its reason.

    python scripts/check_contract.py [data/sets/rl]
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq

from curation.build import contract_reason


def main(root: str = "data/sets/rl") -> int:
    rows, bad, reasons = Counter(), Counter(), {}
    for f in sorted(Path(root).glob("*/*.parquet")):
        for row in pq.read_table(f).to_pylist():
            key = (f"{f.parent.name}/{f.stem}", row["agent_ref"])
            rows[key] += 1
            reason = contract_reason(row)
            if reason:
                bad[key] += 1
                reasons[row["uuid"]] = reason
    for key in sorted(rows):
        print(f"{key[0]:40s} {key[1]:22s} {rows[key]:6d} rows  {bad[key]:3d} broken")
    print(f"total {sum(rows.values())} rows, {sum(bad.values())} broken ({len(reasons)} distinct)")
    for uuid, reason in sorted(reasons.items()):
        print(f"  {uuid}: {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))

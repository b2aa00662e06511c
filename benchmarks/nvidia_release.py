"""NVIDIA's Cascade-2 RL release, config x agent: rows ingested, graded (correct 1, wrong 0) through
``verify_batch``, TRL, verl and NeMo-Gym, and exported back byte for byte; on the Hub-layout fixtures
(:mod:`tests.nvidia_fixtures`). ``python -m benchmarks.nvidia_release`` prints the table (markdown).

A SWE row's correct response is its own ``patch`` in a diff fence, its wrong one a reply without a diff;
its repository is the fixtures' git mirror (``CASCADE_SWE_MIRRORS``).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any


def _responses(row: dict[str, Any], answers: dict[str, dict[str, str]], uid: str) -> tuple[str, str]:
    if row["agent_ref"] == "swe":
        return f"```diff\n{json.loads(row['ground_truth'])['patch']}```", "I fixed the bug."
    return answers[uid]["correct"], answers[uid]["wrong"]


def table() -> list[dict[str, Any]]:
    """One dict per (config, upstream agent): ``upstream`` rows, ``ingested``, ``rejected`` (reasons),
    per wrapper ``"<correct paid 1>/<rows>"`` and ``"<wrong paid 0>/<rows>"``, ``exported`` (lines equal)."""
    from curation.trainer_layouts import nemo_gym_line, verl_row
    from tests.nvidia_fixtures import RESPONSES, ingest, responses_api, upstream_lines, upstream_uuid
    from validators.rewards.nemo_gym import verify as nemo_gym_verify
    from validators.rewards.trl import reward_func
    from validators.rewards.verl import compute_score
    from validators.verifiers.batch import verify_batch

    configs = {"cascade2_rl_if": "IF-RL", "cascade2_rl_multi_domain": "multi-domain-RL", "cascade2_rl_mopd": "MOPD",
               "cascade2_rl_swe": "SWE-RL"}
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for source, (rows, rejects) in ingest("rl").items():
        config = configs[source]
        lines = upstream_lines(config)
        for line in lines.values():
            agent = json.loads(line)["agent_ref"]["name"]
            cell = out.setdefault((config, agent), defaultdict(int, config=config, agent=agent, rejected=[]))
            cell["upstream"] += 1
        for reject in rejects.rows:
            record = json.loads(reject["record"]) if isinstance(reject["record"], str) else reject["record"]
            out[config, record["agent_ref"]["name"]]["rejected"].append(reject["category"])
        for row in rows:
            uid = upstream_uuid(row)
            cell = out[config, json.loads(lines[uid])["agent_ref"]["name"]]
            cell["ingested"] += 1
            correct, wrong = _responses(row, RESPONSES, uid)
            for kind, text, want in (("correct", correct, 1.0), ("wrong", wrong, 0.0)):
                body = {**json.loads(lines[uid]), "response": responses_api(text)}
                v = verl_row(row, "train", 0)
                got = {"verify_batch": verify_batch([text], [row], timeout_s=60)[0].reward,
                       "trl": reward_func(timeout_s=60)([None], [text], **{k: [x] for k, x in row.items()})[0],
                       "verl": compute_score(v["data_source"], text, v["reward_model"]["ground_truth"], v["extra_info"],
                                             timeout_s=60)["score"],
                       "nemo_gym": nemo_gym_verify(body, timeout_s=60)["reward"]}
                for wrapper, reward in got.items():
                    cell[f"{kind}:{wrapper}"] += reward == want
            cell["exported"] += nemo_gym_line(row) == lines[uid]
    return list(out.values())


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        from tests.nvidia_fixtures import calc_mirror

        os.environ["CASCADE_SWE_MIRRORS"] = str(calc_mirror(Path(tmp)))  # before any verifier worker starts
        cells = table()
    wrappers = ("verify_batch", "trl", "verl", "nemo_gym")
    print("| config | agent | rows | ingested | rejected | correct = 1 (batch/TRL/verl/Gym) | wrong = 0 | exported |")
    print("|---|---|---|---|---|---|---|---|")
    for c in cells:
        n = c["ingested"]
        right = " / ".join(f"{c[f'correct:{w}']}" for w in wrappers)
        wrong = " / ".join(f"{c[f'wrong:{w}']}" for w in wrappers)
        print(f"| {c['config']} | {c['agent']} | {c['upstream']} | {n} | {', '.join(c['rejected']) or '-'} | "
              f"{right} of {n} | {wrong} of {n} | {c['exported']} of {n} |")


if __name__ == "__main__":
    main()

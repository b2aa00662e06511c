"""End to end: ``dvc repro`` of the training cascade sft -> if_rl -> multidomain_rl with the default
params (SmolLM2-135M-Instruct, real packed SFT rows and real RL sets), in a temporary copy of the
repository. The data stages are not rerun: their outputs are copied in and the training stages are
reproduced with ``--single-item``; ``data/packed`` is built there by the tokenize and pack stages
when the repository has none yet."""

import json
import sys
import time

import pytest

from stages.checkpoints import CheckpointRegistry, read_record
from tests.repo_copy import cascade_copy as make_cascade_copy
from tests.repo_copy import run_checked

CASCADE = ["sft", "if_rl", "multidomain_rl"]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cascade_copy(tmp_path_factory, smollm2_dir):
    dst = tmp_path_factory.mktemp("cascade")
    env, dvc = make_cascade_copy(dst)
    t0 = time.perf_counter()
    out = run_checked([*dvc, "repro", "--single-item", *CASCADE], dst, env)
    wall = time.perf_counter() - t0
    print(f"\ndvc repro {' '.join(CASCADE)}: {wall:.0f} s")
    return dst, env, out, wall


def test_cascade_writes_checkpoints_with_lineage_and_per_domain_metrics(cascade_copy):
    dst, _, out, _ = cascade_copy
    for stage in CASCADE:
        assert f"Running stage '{stage}'" in out
    record = read_record(dst / "data/checkpoints/multidomain_rl")
    assert record["lineage"] == CASCADE
    # the RL stages read the difficulty-filtered sets (copied in, or built by `difficulty` in the copy)
    assert set(record["parent_datasets"]) == {"data/packed", "data/filtered/rl/instruction_following"}
    assert record["datasets"]["data/filtered/rl/multi_domain"].startswith("md5:")
    applied = record["difficulty_filter"]["data/filtered/rl/multi_domain"]
    assert applied["difficulty_filter"] == "applied" and applied["full_set"] == "data/sets/rl/multi_domain"
    for stage in CASCADE:
        summary = json.loads((dst / "metrics/train" / f"{stage}.json").read_text())
        assert summary["steps"] >= 1 and not any(k.endswith("_s") for k in summary["final"])  # no timings
        assert {"instruction_following", "stem_mcqa", "tool_calling"} <= set(summary["validation"])
        for domain, m in summary["validation"].items():
            if m["rows"] == 0:  # every held-out row longer than max_prompt_tokens: counted, not scored
                assert m["prompt_too_long"] > 0 and "reward" not in m, (stage, domain)
                continue
            assert 0.0 <= m["reward"] <= 1.0, (stage, domain)
        assert (dst / "plots" / f"{stage}.png").read_bytes()[:4] == b"\x89PNG"
    rl = json.loads((dst / "metrics/train/if_rl.json").read_text())
    assert "reward_mean" in rl["final"] and rl["counts"]["train_prompts"] > 0
    best = CheckpointRegistry(dst / "data/checkpoints").best_per_domain()
    assert set(best) >= {"instruction_following", "stem_mcqa"}


def test_second_repro_is_a_noop_and_dvc_lists_training_metrics(cascade_copy):
    dst, env, _, _ = cascade_copy
    out = run_checked([sys.executable, "-m", "dvc", "repro", "--single-item", *CASCADE], dst, env)
    assert "Running stage" not in out
    shown = json.loads(run_checked([sys.executable, "-m", "dvc", "metrics", "show", "--json"], dst, env))
    assert {f"metrics/train/{s}.json" for s in CASCADE} <= set(shown[""]["data"])

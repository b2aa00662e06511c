"""The Hub SWE-RL row loader on a local fixture of the SWE-Gym / R2E-Gym schema, and a Hub-style
row (repository + base commit + test_patch) run through the agent loop from a local git mirror."""

from __future__ import annotations

import json
import subprocess

import pytest

from corpora.adapters import get_adapter
from corpora.registry import SourceSpec
from corpora.schema import RecordError
from curation.ingest import finalize_row
from tests.swe_policies import ScriptedPolicy, tool_call
from validators.episodes import run_episodes
from validators.swe.environment import AgentConfig, SWEEnvironment

SPEC = SourceSpec(name="swe_gym", kind="hf", path="SWE-Gym/SWE-Gym", format="hf", adapter="swe_gym", output="rl",
                  domain="swe", role="train", license="MIT")
# one record as SWE-Gym ships it (test lists are JSON strings, as in SWE-bench)
SWE_GYM = {"instance_id": "getmoto__moto-5752", "repo": "getmoto/moto",
           "base_commit": "b2300f1eae1323e3e8bc45f97e530ce129dff12e",
           "problem_statement": "describe_parameters depends on filter order\n...",
           "patch": "diff --git a/moto/ssm/models.py b/moto/ssm/models.py\n", "test_patch": "diff --git a/tests/x.py\n",
           "FAIL_TO_PASS": json.dumps(["tests/test_ssm/test_ssm_boto3.py::test_describe_parameters__multiple_tags"]),
           "PASS_TO_PASS": json.dumps(["tests/test_ssm/test_ssm_boto3.py::test_get_parameter"]),
           "version": "4.0", "created_at": "2022-12-10T20:23:01Z", "hints_text": "", "environment_setup_commit": "abc"}
R2E_GYM = {"instance_id": "r2e__1", "repo_name": "orange3", "commit_hash": "0f1e2d", "problem_statement": "bug",
           "FAIL_TO_PASS": ["t.py::test_a"], "PASS_TO_PASS": [], "docker_image": "namanjain12/orange3_final:0f1e2d"}


def test_swe_gym_record_becomes_a_canonical_swe_row():
    row = finalize_row(get_adapter("swe_gym")(SWE_GYM, SPEC, None), SPEC, SWE_GYM["instance_id"], 0)
    gt, meta = json.loads(row["ground_truth"]), json.loads(row["metadata"])
    assert row["domain"] == "swe" and row["agent_ref"] == "swe"
    assert gt["repo"] == "getmoto/moto" and gt["base_commit"].startswith("b2300f1")
    assert gt["FAIL_TO_PASS"] == ["tests/test_ssm/test_ssm_boto3.py::test_describe_parameters__multiple_tags"]
    assert gt["test_patch"].startswith("diff --git") and meta["version"] == "4.0"
    assert row["responses_create_params"]["input"][1]["content"].startswith("describe_parameters")
    assert [t["function"]["name"] for t in json.loads(row["responses_create_params"]["tools"])][-1] == "submit"


def test_r2e_gym_aliases_and_bad_records_name_the_field():
    row = finalize_row(get_adapter("swe_gym")(R2E_GYM, SPEC, None), SPEC, "r2e__1", 0)
    assert json.loads(row["ground_truth"])["base_commit"] == "0f1e2d"
    assert json.loads(row["metadata"])["docker_image"].startswith("namanjain12")
    for bad, field in [({**SWE_GYM, "base_commit": None}, "base_commit: missing"),
                       ({**SWE_GYM, "FAIL_TO_PASS": "[]"}, "FAIL_TO_PASS: empty"),
                       ({**SWE_GYM, "PASS_TO_PASS": "not json"}, "PASS_TO_PASS: not valid JSON")]:
        with pytest.raises(RecordError, match=field):
            get_adapter("swe_gym")(bad, SPEC, None)


def _git(cwd, *args):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout.strip()


def test_hub_row_runs_from_a_git_mirror_with_its_test_patch(tmp_path):
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "__init__.py").write_text("def double(x):\n    return x + x + 1\n")
    (src / "tests").mkdir()
    (src / "tests" / "test_pkg.py").write_text(
        "from pkg import double\n\ndef test_zero():\n    assert double(0) in (0, 1)\n")
    _git(src, "init", "-q")
    _git(src, "add", ".")
    _git(src, "commit", "-qm", "base")
    commit = _git(src, "rev-parse", "HEAD")
    _git(tmp_path, "clone", "-q", "--mirror", str(src), str(tmp_path / "mirrors" / "acme__pkg"))
    test_patch = ("diff --git a/tests/test_pkg.py b/tests/test_pkg.py\n--- a/tests/test_pkg.py\n+++ b/tests/test_pkg.py\n"
                  "@@ -2,3 +2,6 @@ from pkg import double\n \n def test_zero():\n     assert double(0) in (0, 1)\n+\n"
                  "+def test_two():\n+    assert double(2) == 4\n")
    record = {**SWE_GYM, "repo": "acme/pkg", "base_commit": commit, "test_patch": test_patch,
              "FAIL_TO_PASS": ["tests/test_pkg.py::test_two"], "PASS_TO_PASS": ["tests/test_pkg.py::test_zero"]}
    row = finalize_row(get_adapter("swe_gym")(record, SPEC, None), SPEC, "acme", 0)
    env = SWEEnvironment(tmp_path, AgentConfig(mirrors=str(tmp_path / "mirrors")))
    fix = tool_call("edit_file", path="pkg/__init__.py", old_text="x + x + 1", new_text="x + x")
    fixed = run_episodes(env, ScriptedPolicy(lambda ep: [fix]), [row])
    noop = run_episodes(env, ScriptedPolicy.noop(), [row])
    assert fixed[0].grade.reward == 1.0 and noop[0].grade.reward == 0.0
    assert noop[0].grade.failing == ["tests/test_pkg.py::test_two"]
    with pytest.raises(FileNotFoundError, match="no git mirror of acme/pkg"):
        SWEEnvironment(tmp_path, AgentConfig()).reset(row)

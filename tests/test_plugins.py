"""An out-of-tree plugin (``tests/plugin_pkg``: an RL domain, its verifier and a stage runner, declared
as entry points), installed the way a user installs one: the schema accepts its domain, synthesis
knows its SFT domain, the batch grader's worker processes grade with it, and ``cascade train`` runs
its stage. Adding a verifier or a stage is one file plus its entry points."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
PLUGIN = Path(__file__).with_name("plugin_pkg")


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory):
    site, src = tmp_path_factory.mktemp("site"), tmp_path_factory.mktemp("src") / "plugin"
    shutil.copytree(PLUGIN, src)  # a build leaves build/ and *.egg-info beside the sources: not in the repo
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-build-isolation",
                    "--disable-pip-version-check", "--target", str(site), str(src)], check=True,
                   capture_output=True)
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(REPO)]))


def _last_json_line(code: str, env: dict) -> object:
    """The JSON value ``python -c code`` prints last, run with ``env`` (the plugin installed)."""
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_plugin_verifier_grades_in_the_worker_processes(plugin_env):
    code = ("import json; from validators.verifiers import verify_batch\n"
            "from corpora.schema import rl_domains, validate_row\n"
            "from curation.synthesize import sft_domain\n"
            "assert 'palindromes' in rl_domains() and sft_domain('palindromes') == 'chat'\n"
            "validate_row('rl', {'uuid': 'p', 'domain': 'palindromes', 'agent_ref': 'palindrome', 'source': 's',\n"
            "    'source_version': '1', 'license': 'MIT', 'responses_create_params': {'input': [\n"
            "    {'role': 'user', 'content': 'Write a palindrome.'}]}})\n"
            "rows = [{'uuid': 'p', 'agent_ref': 'palindrome'}] * 3\n"
            "out = verify_batch(['<think>hmm</think>Never odd or even', 'not one', '<think>open'], rows, workers=2)\n"
            "print(json.dumps([[v.reward, v.reason, v.error] for v in out]))")
    assert _last_json_line(code, plugin_env) == [
        [1.0, "palindrome", None], [0.0, "not a palindrome", None],
        [0.0, "unclosed <think> block: no final answer", None]]


def test_a_plugin_nemo_gym_agent_routes_upstream_rows_to_its_verifier(plugin_env):
    code = ("import json; from validators.rewards.nemo_gym import verify\n"
            "from corpora.nemo_gym import canonical_fields\n"
            "row = {'uuid': 'p', 'agent_ref': {'type': 'responses_api_agents', 'name': 'palindrome_simple_agent'},\n"
            "       'responses_create_params': {'input': [{'role': 'user', 'content': 'A palindrome?'}]},\n"
            "       'min_letters': 5}\n"
            "f = canonical_fields(row)\n"
            "out = [verify({**row, 'response': {'output': [{'type': 'message', 'content': [\n"
            "    {'type': 'output_text', 'text': t}]}]}})['reward'] for t in ('Never odd or even', 'not one')]\n"
            "print(json.dumps([f['agent_ref'], f['domain'], f['ground_truth'], out]))")
    assert _last_json_line(code, plugin_env) == ["palindrome", "palindromes", {"min_letters": 5},
                                                                [1.0, 0.0]]


def test_a_plugin_stage_runs_through_cascade_train(plugin_env, tmp_path):
    init = tmp_path / "init"
    init.mkdir()
    (init / "config.json").write_text("{}")
    stage = {"runner": "copy_init", "datasets": [], "note": "from a plugin",
             "checkpoint_root": str(tmp_path / "ckpt"), "metrics_dir": str(tmp_path / "metrics")}
    params = {"sandbox": {"require": "rlimits"}, "cascade": {"model": str(init), "order": ["toy"], "stages": {"toy": stage}}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    cascade = Path(sys.executable).with_name("cascade")
    proc = subprocess.run([str(cascade), "train", "toy"], cwd=tmp_path, env=plugin_env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "ckpt" / "toy" / "config.json").read_text() == "{}"
    assert json.loads((tmp_path / "metrics" / "toy.json").read_text())["note"] == "from a plugin"
    typo = dict(stage, notte="x")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({**params, "cascade": {**params["cascade"],
                                                                               "stages": {"toy": typo}}}))
    proc = subprocess.run([str(cascade), "train", "toy"], cwd=tmp_path, env=plugin_env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 1 and "cascade.stages.toy.notte" in proc.stderr

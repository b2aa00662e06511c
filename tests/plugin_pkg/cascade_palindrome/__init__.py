"""A plugin for cascade-rl: the ``palindromes`` RL domain graded by the ``palindrome`` verifier (reward 1
when the final answer reads the same backwards, letters only, case folded; synthesized conversations
are ``chat``) and the ``copy_init`` stage runner (its checkpoint is a copy of its init checkpoint,
plus a metrics file), and the NeMo-Gym agent ``palindrome_simple_agent`` (rows in NeMo-Gym's layout
naming it are graded by ``palindrome``; its ``min_letters`` field becomes the ground truth)."""

import json
import shutil
from pathlib import Path
from typing import ClassVar

from corpora.nemo_gym import NemoGymAgent, nothing_to_verify
from stages.base import StageConfig, StageResult
from validators.verifiers import Verdict, Verifier


class PalindromeVerifier(Verifier):
    sft_domain = "chat"

    def score(self, answer, row):
        letters = [c.lower() for c in answer if c.isalpha()]
        ok = bool(letters) and letters == letters[::-1]
        return Verdict(float(ok), ok, "palindrome" if ok else "not a palindrome")


def _palindrome_truth(raw):
    if not raw.get("min_letters"):
        raise nothing_to_verify("no min_letters")
    return {"min_letters": raw["min_letters"]}, {}


PALINDROME_AGENT = NemoGymAgent("palindrome_simple_agent", "palindrome", "palindromes", _palindrome_truth)


class CopyInitConfig(StageConfig):
    note: str = "copied"


class CopyInitStage:
    config_class: ClassVar[type[StageConfig]] = CopyInitConfig

    def __init__(self, config, environment=None):
        self.cfg, self.environment = config, environment

    def run(self, datasets, init_checkpoint):
        out = self.cfg.checkpoint_dir
        shutil.copytree(init_checkpoint, out, dirs_exist_ok=True)
        metrics = Path(self.cfg.metrics_dir) / f"{self.cfg.name}.json"
        metrics.parent.mkdir(parents=True, exist_ok=True)
        summary = {"note": self.cfg.note, "datasets": list(datasets), "wall_s": 0.0}
        metrics.write_text(json.dumps(summary))
        return StageResult(out, metrics, summary)

"""Real MBPP problems (tasks 11 and 13 of MBPP, CC-BY-4.0) as the rows ingest makes, and SWE task
sets built from them with the real builder (tests of curation/swe and stages/swe_*)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import polars as pl

from common.io import Rejects, write_parquet
from corpora.schema import SCHEMAS
from curation.params import MutantBudget
from curation.swe.repos import mbpp_repo
from curation.swe.tasks import build_repo_tasks

MBPP = {
    11: ("Write a python function to remove first and last occurrence of a given character from the string.",
         ['assert remove_Occ("hello","l") == "heo"', 'assert remove_Occ("abcda","a") == "bcd"',
          'assert remove_Occ("PHP","P") == "H"'],
         ("def remove_Occ(s,ch): \n    for i in range(len(s)): \n        if (s[i] == ch): \n"
          "            s = s[0 : i] + s[i + 1:] \n            break\n    for i in range(len(s) - 1,-1,-1):  \n"
          "        if (s[i] == ch): \n            s = s[0 : i] + s[i + 1:] \n            break\n    return s")),
    13: ("Write a function to count the most common words in a dictionary.",
         [("assert count_common(['one', 'two', 'three', 'four', 'five', 'one', 'two', 'one', 'three', 'one']) == "
           "[('one', 4), ('two', 2), ('three', 2), ('four', 1)]"),
          ("assert count_common(['Facebook', 'Apple', 'Amazon', 'Netflix', 'Google', 'Apple', 'Netflix', 'Amazon']) == "
           "[('Apple', 2), ('Amazon', 2), ('Netflix', 2), ('Facebook', 1)]")],
         ("from collections import Counter\ndef count_common(words):\n  word_counts = Counter(words)\n"
          "  top_four = word_counts.most_common(4)\n  return (top_four)")),
}


def mbpp_rows(task_id: int) -> tuple[dict, dict]:
    """``(problem RL row, solution SFT row)`` of MBPP task ``task_id``, as ingest writes them."""
    text, tests, code = MBPP[task_id]
    problem = {"uuid": f"p{task_id}", "source": "mbpp_problems", "source_version": "0.9.0", "license": "CC-BY-4.0",
               "ground_truth": json.dumps({"tests": tests, "setup_code": "", "mode": "assert"}),
               "metadata": json.dumps({"task_id": task_id, "question": text}),
               "responses_create_params": {"input": [{"role": "user", "content": f"{text}\n{tests[0]}"}], "tools": "[]"},
               "domain": "code", "agent_ref": "code"}
    solution = {"uuid": f"s{task_id}", "messages": json.dumps([{"role": "user", "content": text},
                                                               {"role": "assistant", "content": f"```python\n{code}\n```"}])}
    return problem, solution


def build_set(out: Path, task_ids=(11, 13), mutants_per_repo: int = 6, seed: int = 0) -> list[dict]:
    """Build one task per MBPP problem into ``out`` (``train.parquet`` + ``validation.parquet``
    holding the same rows, and ``repos/``); returns the rows."""
    rows, rejects = [], Rejects("swe_tasks")
    for tid in task_ids:
        budget = MutantBudget(mutants_per_repo=mutants_per_repo, tasks_per_repo=1)
        got, _ = build_repo_tasks(mbpp_repo(*mbpp_rows(tid)), budget, random.Random(seed), rejects, out / "repos", 60.0)
        rows += got
    for split in ("train", "validation"):
        write_parquet(pl.DataFrame(rows).to_arrow(), out / f"{split}.parquet", SCHEMAS["rl"])
    return rows

"""The held-out partition: which problems are for evaluation only, by a hash of their question text.

Rule: bucket = sha256(dataset + "\\0" + question) as a big-endian integer mod 100; a problem is held out (eval)
when its bucket is below `EVAL_PERCENT`. The partition depends only on the dataset name and the question text, not
on seeds, indices, options or the process, so every node splits every problem space the same way: training draws
skip held-out problems, evaluation draws only held-out ones, and a peer's group on a held-out question is dropped
(`sharing/rescore.py`, reason "heldout"). Indices cannot partition a reasoning-gym dataset: procedural datasets
repeat questions across indices and seeds (the default task has 200 distinct questions over a million indices).
"""

from __future__ import annotations

import hashlib

from swarm_node.tasks.reference import TaskInstance

EVAL_PERCENT = 15  # share of each problem space held out for evaluation (buckets 0..14 of 100)
BUCKETS = 100


def bucket(dataset: str, question: str) -> int:
    """The problem's bucket in [0, BUCKETS): the same in every process, for every seed."""
    digest = hashlib.sha256(f"{dataset}\0{question}".encode()).digest()
    return int.from_bytes(digest, "big") % BUCKETS


def is_heldout_question(dataset: str, question: str) -> bool:
    return bucket(dataset, question) < EVAL_PERCENT


def is_heldout(inst: TaskInstance) -> bool:
    """Whether an instance belongs to the eval part of its dataset (never trained on)."""
    return is_heldout_question(inst.ref.dataset, inst.question)

"""The partition of every problem space into test, validation and training questions, by a hash of the question.

Rule: bucket = sha256(dataset + "\\0" + question) as a big-endian integer mod 100. `SPLITS` names the buckets
never trained on: "test" (buckets 0..14, `EVAL_PERCENT`: the held-out eval every report uses) and "validation"
(buckets 15..19: evaluated on request, for choosing hyper-parameters without touching the test split); every other
bucket is for training. The partition depends only on the dataset name and the question text, not on seeds,
indices, options or the process, so every node splits every problem space the same way: training draws skip both
held-out splits (`is_heldout`), evaluation draws from one split (`in_split`), and a peer's group on a test or a
validation question is dropped (`sharing/rescore.py`, reason "heldout" for both). Indices cannot partition a
reasoning-gym dataset: procedural datasets repeat questions across indices and seeds (one-digit chain_sum has 200
distinct questions over a million indices).
"""

from __future__ import annotations

import hashlib

from swarm_node import variants
from swarm_node.tasks.reference import TaskInstance

BUCKETS = 100
# split name -> its buckets; a split is never trained on. Buckets 0..14 were the whole held-out part before the
# validation split existed: the test split keeps them, so earlier held-out numbers stay comparable.
SPLITS: variants.Registry[range] = variants.Registry("eval split", variants.EVAL_SPLITS)
SPLITS.add("test", range(0, 15))
SPLITS.add("validation", range(15, 20))
DEFAULT_SPLIT = "test"
EVAL_PERCENT = len(SPLITS["test"])  # share of each problem space in the test split
HELDOUT_BUCKETS = frozenset(b for buckets in SPLITS.values() for b in buckets)


def bucket(dataset: str, question: str) -> int:
    """The problem's bucket in [0, BUCKETS): the same in every process, for every seed."""
    digest = hashlib.sha256(f"{dataset}\0{question}".encode()).digest()
    return int.from_bytes(digest, "big") % BUCKETS


def in_split(split: str, dataset: str, question: str) -> bool:
    """Whether a question belongs to the named split (`SPLITS`; an unknown name is an `UnknownVariant`)."""
    return bucket(dataset, question) in SPLITS[split]


def is_heldout_question(dataset: str, question: str) -> bool:
    """Whether a question is in a held-out split (test or validation): never trained on."""
    return bucket(dataset, question) in HELDOUT_BUCKETS


def is_heldout(inst: TaskInstance) -> bool:
    """Whether an instance is held out (test or validation): never drawn for training, never trained on from a
    peer."""
    return is_heldout_question(inst.ref.dataset, inst.question)

"""Turning scored rollouts into policy updates, and measuring the policy.

- `scoring.py`: our verifier's rewards and group-relative advantages for a group; groups into `TrainSample`s.
- `batching.py`: samples into padded tensors, and minibatches that keep each group whole.
- `trainer.py`: the GRPO `Trainer` (clipped surrogate, truncated importance weights for off-policy rows).
- `staleness.py`: the version-lag bound S (drop reasons, the rollout buffer, may-generate).
- `overlap.py`: generation overlapped with training (ECHO-2), within S.
- `partial.py`: the rollout modes (sync, APRIL's partial rollouts, dynamic sampling: `dynamic_sampling.py`, pure).
- `evaluate.py`: greedy accuracy and sampled reward on held-out problems.
- `signal.py`: saying when nothing is learnt (no group with signal for a while), and the likely cause.
- `memory_estimate.py`: one step's peak memory, part by part (pure); `sizing.py`: the sizes that fit a budget, the
  shrink order, the knobs a too-small budget needs, the run-time guard (docs/SIZING.md).
"""

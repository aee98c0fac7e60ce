"""Pure RL math: tensors in, tensors out. No I/O, no model, no config objects.

- `advantages.py`: group-relative advantage estimators, registry `ADVANTAGE_ESTIMATORS` (grpo, dr_grpo, median:
  MC-GRPO, whose pivot completion trains no row).
- `stale.py`: corrections of our own stale rollouts, registry `STALE_CORRECTIONS` (none, tis, m2po, vcpo).
- `loss.py`: policy losses, registry `LOSSES` (the clipped GRPO surrogate), KL k3, truncated importance weights.
- `logprobs.py`: log-probs of the distribution actually sampled from (temperature, top-p).
"""

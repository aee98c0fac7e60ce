"""Pure RL math: tensors in, tensors out. No I/O, no model, no config objects.

- `advantages.py`: group-relative advantage estimators, registry `ADVANTAGE_ESTIMATORS` (grpo, dr_grpo, median).
- `loss.py`: policy losses, registry `LOSSES` (the clipped GRPO surrogate), KL k3, truncated importance weights.
- `logprobs.py`: log-probs of the distribution actually sampled from (temperature, top-p).
"""

"""Pure RL math: tensors in, tensors out. No I/O, no model, no config objects."""

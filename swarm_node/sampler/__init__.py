"""Samplers: generate G completions per prompt with behaviour log-probs, and take new weights.

`base.Sampler` is the interface; `hf.HFSampler` (transformers) is the reference; `native.NativeSampler` (its own
decoding loop, `kv_decoder`) is the CPU fallback for the models it runs; the vLLM sampler lives in `vllm_sampler`.
`make_sampler` picks one by name (`auto|vllm|native|hf`).
"""

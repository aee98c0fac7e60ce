"""Transformers sampler: the reference implementation and the CPU fallback.

Uses `generate(output_scores=True)`: the scores it returns are the logits after temperature and top-p warping,
so their log-softmax is exactly the processed log-prob of `rl.logprobs`. Weights are shared by copy, not by
reference, so the trainer can keep updating its own model while this one samples the version it was given.
Dtype: the copy runs in `dtype` (the node's `Hardware.sampler_dtype`: the checkpoint's bf16 where the device
computes in it, else float32); the log-probs are taken in fp32 either way. Device: the copy stays on the given
model's device (model/device.py placed it); inputs go there and results come
back as Python lists. A seeded call forks the RNG of that device too, so it leaves the caller's streams as they were.
Sampling settings are ours alone: `generate` gets a generation config built from `SamplingParams`, never the model
directory's `generation_config.json`, whose processors the trainer does not reproduce (a `repetition_penalty` of
1.1, as Qwen2.5-Instruct ships, bent the behaviour log-probs by ~1.4-1.9 nats a completion); those found in the
model's config are named in one line at start (`unreproduced_processors`).
Memory: `max_rows` (0: no limit; `limit_rows`, from the node's memory sizing, train/sizing.py) caps the rows of one
`generate()` pass; a larger request runs in consecutive passes of whole prompts, the seeded RNG running on from
one pass to the next. With no cap (the default) a call is one pass, as before.
Resume (APRIL, `Sampler.resume`): prompt + the tokens so far as one left-padded row each, no KV cache kept between
calls, so under greedy decoding and unchanged weights a completion resumed in chunks is token-identical to one
generated at once. A token id past the vocabulary fails the embedding (IndexError): `ResumeError`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from swarm_node.model.tokenizer import eos_ids
from swarm_node.sampler.base import Completion, Sampler, SamplingParams, check_prompt_lengths

# Processors of a generation config that change the sampling distribution, with the value that turns each off.
NEUTRAL_PROCESSORS: dict[str, object] = {
    "repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0, "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0, "min_length": 0, "min_new_tokens": None, "bad_words_ids": None,
    "suppress_tokens": None, "begin_suppress_tokens": None, "sequence_bias": None, "forced_bos_token_id": None,
    "forced_eos_token_id": None, "exponential_decay_length_penalty": None, "typical_p": 1.0, "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0, "min_p": None, "length_penalty": 1.0,
    "top_k": 0,  # Qwen2.5-Instruct ships 20; neither our samplers nor the trainer apply a top-k
}


def unreproduced_processors(config: GenerationConfig | None) -> list[str]:
    """`name=value` of each distribution-changing processor a model's generation config turns on (sorted)."""
    if config is None:
        return []
    found = []
    for name, neutral in sorted(NEUTRAL_PROCESSORS.items()):
        value = getattr(config, name, neutral)
        if value not in (neutral, None):
            found.append(f"{name}={value}")
    return found


class HFSampler(Sampler):
    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, version: int = 0,
                 log: Callable[[str], None] | None = None, dtype: str = "float32") -> None:
        off = unreproduced_processors(getattr(model, "generation_config", None))
        if off and log is not None:
            log("sampler: off from the model's generation_config.json (the trainer does not reproduce them): "
                + ", ".join(off))
        self.model = copy.deepcopy(model).eval().to(getattr(torch, dtype))
        self.tokenizer = tokenizer
        # Every EOS id of the model ends a completion (its generation config may list several).
        self.eos_ids = eos_ids(tokenizer, getattr(getattr(model, "generation_config", None), "eos_token_id", None))
        self.version = version
        self.max_len = int(getattr(model.config, "max_position_embeddings", 2048))
        self.device = next(self.model.parameters()).device
        self.max_rows = 0  # rows per generate() pass; 0: all rows in one pass

    def limit_rows(self, rows: int) -> None:
        self.max_rows = rows

    def passes(self, prompts: int, n: int) -> list[range]:
        """Prompt index ranges, one per generate() pass: whole prompts, at most max_rows rows (at least one prompt)."""
        per = max(1, self.max_rows // n) if self.max_rows else max(prompts, 1)
        return [range(i, min(i + per, prompts)) for i in range(0, prompts, per)]

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        self.model.load_state_dict(state_dict, strict=False)
        self.version = version

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams) -> list[list[Completion]]:
        check_prompt_lengths(prompts, params.max_new_tokens, self.max_len)
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices, enabled=params.seed is not None):
            if params.seed is not None:
                torch.manual_seed(params.seed)
            return [group for part in self.passes(len(prompts), n)
                    for group in self._generate([prompts[i] for i in part], n, params)]

    def decode(self, token_ids: tuple[int, ...] | list[int]) -> str:
        return self.tokenizer.decode([t for t in token_ids if t not in self.eos_ids], skip_special_tokens=True)

    def _generate(self, prompts: list[list[int]], n: int, params: SamplingParams) -> list[list[Completion]]:
        eos = self.eos_ids
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos[0]
        rows = [p for p in prompts for _ in range(n)]
        width = max(len(p) for p in rows)
        # Left padding: every row's next token is generated at the same position.
        input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        for i, p in enumerate(rows):
            input_ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            attention[i, width - len(p):] = 1
        greedy = params.temperature <= 0
        padded = range(len(self.tokenizer), int(self.model.config.vocab_size))  # embedding rows that are no token
        config = GenerationConfig(
            max_new_tokens=params.max_new_tokens, do_sample=not greedy,
            temperature=1.0 if greedy else params.temperature, top_p=1.0 if greedy else params.top_p,
            output_scores=True, return_dict_in_generate=True, pad_token_id=pad, eos_token_id=list(eos),
            **{**NEUTRAL_PROCESSORS, "suppress_tokens": list(padded) or None})
        out = self.model.generate(input_ids=input_ids.to(self.device), attention_mask=attention.to(self.device),
                                  generation_config=config)
        new_tokens = out.sequences[:, width:]  # [rows, steps]
        # scores: one [rows, V] per generated step, already warped (temperature, top-p) when sampling.
        logps = torch.stack([s.float().log_softmax(-1) for s in out.scores], dim=1)  # [rows, steps, V]
        token_logps = logps.gather(-1, new_tokens.unsqueeze(-1)).squeeze(-1).cpu()  # [rows, steps]
        new_tokens = new_tokens.cpu()
        results: list[list[Completion]] = []
        for i in range(len(rows)):
            ids = new_tokens[i].tolist()
            end = next((k for k, t in enumerate(ids) if t in eos), None)
            if end is not None:
                ids = ids[: end + 1]
            lps = token_logps[i, : len(ids)].tolist()
            text = self.decode(ids)
            if i % n == 0:
                results.append([])
            results[-1].append(Completion(ids, text, lps, self.version))
        return results

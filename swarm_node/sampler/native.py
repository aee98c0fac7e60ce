"""Native sampler: the transformers sampler's behaviour with its own decoding loop (sampler/kv_decoder.py), for
small Qwen2- and Llama-family models on a CPU, where `generate()` spends its time on bookkeeping.

Contract: everything of `HFSampler` (weights by copy, dtype, EOS ids, seeds, rows per pass, resume, decode) except
how a pass is generated. A pass prefills each distinct prompt once, gives it n rows, and decodes one token per live
row a step from a preallocated cache; a row leaves the batch at its first EOS (the batch is compacted once a
`COMPACT_FRACTION` of its rows has finished), so the step's cost follows the rows still generating, not the
longest one. A token is drawn from `rl.logprobs.processed_log_softmax` of the row's logits (temperature, top-p, the
padded vocabulary masked), so its recorded log-prob is by construction the trainer's definition (`draw`: one
uniform number a row against the cumulative distribution, cheaper than `torch.multinomial`); greedy decoding takes
the arg-max. Under greedy decoding its tokens equal the transformers sampler's; under sampling both draw
from the same distribution with different random streams (a seed makes either reproducible, not both equal).
"""

from __future__ import annotations

import torch

from swarm_node.rl.logprobs import processed_log_softmax
from swarm_node.sampler.base import Completion, SamplingParams
from swarm_node.sampler.hf import HFSampler
from swarm_node.sampler.kv_decoder import KVDecoder, unsupported

__all__ = ["NativeSampler", "unsupported"]

COMPACT_FRACTION = 0.125  # finished rows in the batch that make a compaction worth its copy


def draw(log_probs: torch.Tensor) -> torch.Tensor:
    """One token a row [B, V] -> [B], token i with probability exp(log_probs[i]): the first index whose cumulative
    probability exceeds u ~ U[0, total) (float64: u < total always, so a token of probability 0 is never drawn)."""
    cdf = log_probs.double().exp().cumsum(-1)
    u = torch.rand(log_probs.shape[0], 1, dtype=torch.float64, device=log_probs.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True)[:, 0]


class NativeSampler(HFSampler):
    def _generate(self, prompts: list[list[int]], n: int, params: SamplingParams) -> list[list[Completion]]:
        rows, steps = len(prompts) * n, params.max_new_tokens
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_ids[0]
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):  # left padding: every row's next token goes to the same column
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            attention[i, width - len(p):] = 1
        tokens = torch.zeros(rows, steps, dtype=torch.long)
        logprobs = torch.zeros(rows, steps)
        lengths = torch.full((rows,), steps, dtype=torch.long)
        if steps > 0:
            self._decode(ids, attention, n, params, tokens, logprobs, lengths)
        results: list[list[Completion]] = []
        for i in range(rows):
            length = int(lengths[i])
            token_ids, lps = tokens[i, :length].tolist(), logprobs[i, :length].tolist()
            if i % n == 0:
                results.append([])
            results[-1].append(Completion(token_ids, self.decode(token_ids), lps, self.version))
        return results

    def _decode(self, ids: torch.Tensor, attention: torch.Tensor, n: int, params: SamplingParams,
                tokens: torch.Tensor, logprobs: torch.Tensor, lengths: torch.Tensor) -> None:
        """Fill tokens/logprobs [rows, steps] and each row's length (through its EOS; `steps` if none)."""
        decoder = KVDecoder(self.model, ids.shape[1] + params.max_new_tokens)
        eos = torch.tensor(self.eos_ids, device=self.device)
        vocab = len(self.tokenizer)
        logits = decoder.prefill(ids, attention).repeat_interleave(n, 0)
        decoder.repeat(n)
        live = torch.arange(logits.shape[0])  # the original row of each row in the batch
        done = torch.zeros(logits.shape[0], dtype=torch.bool)  # rows that ended: decoded on, never recorded
        for step in range(params.max_new_tokens):
            log_probs = processed_log_softmax(logits, params.temperature, params.top_p, vocab)
            if params.temperature <= 0:
                chosen = log_probs.argmax(-1)
            else:
                chosen = draw(log_probs)
            chosen_logprobs = log_probs.gather(-1, chosen[:, None])[:, 0].float().cpu()
            ended = torch.isin(chosen, eos).cpu()
            chosen = chosen.cpu()
            recorded = ~done
            tokens[live[recorded], step] = chosen[recorded]
            logprobs[live[recorded], step] = chosen_logprobs[recorded]
            ended &= recorded
            lengths[live[ended]] = step + 1
            done |= ended
            if done.all() or step + 1 == params.max_new_tokens:
                return
            if done.sum() >= max(1, int(COMPACT_FRACTION * len(live))):
                kept = (~done).nonzero()[:, 0]
                decoder.keep(kept.to(self.device))
                live, chosen, done = live[kept], chosen[kept], done[kept]
            logits = decoder.step(chosen)

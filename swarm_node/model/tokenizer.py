"""Character-level tokenizer built in code (no hub is reachable), saved in the standard HF format.

Every printable ASCII character and newline is one token; ids 0-2 are <pad>, <eos>, <unk>. The result is a
`PreTrainedTokenizerFast`, so the HF sampler, vLLM and `--model PATH` all load it the same way.
"""

from __future__ import annotations

import hashlib
import json

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<pad>", "<eos>", "<unk>"]
CHARACTERS = ["\n"] + [chr(c) for c in range(32, 127)]


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # Split every character into its own pre-token; Fuse joins them back without spaces when decoding.
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        eos_token="<eos>",
        unk_token="<unk>",
        bos_token=None,
        model_max_length=512,
    )


def eos_ids(tokenizer: PreTrainedTokenizerBase, generation_eos: int | list[int] | None = None) -> tuple[int, ...]:
    """Every id that ends a completion: the tokenizer's EOS first, then those of the model's generation config
    (`generation_config.json`'s `eos_token_id`, an id or a list: Qwen2.5-Instruct lists <|im_end|> and <|endoftext|>,
    Llama-3-Instruct three ids)."""
    extra = [generation_eos] if isinstance(generation_eos, int) else list(generation_eos or [])
    ids = [int(tokenizer.eos_token_id)] if tokenizer.eos_token_id is not None else []
    return tuple(dict.fromkeys(ids + [int(i) for i in extra]))


def tokenizer_hash(tokenizer: PreTrainedTokenizerBase) -> str:
    """A stable hash of the vocabulary: equal hashes mean token ids can be exchanged as they are."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    payload = json.dumps([vocab, tokenizer.eos_token_id], separators=(",", ":")).encode()
    return hashlib.sha256(payload).hexdigest()[:16]

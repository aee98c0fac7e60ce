"""Byte-level BPE tokenizers trained offline, shaped like the ones real instruct models ship.

`build_bpe_tokenizer(spec)` trains a byte-level BPE with the `tokenizers` library on a small corpus generated here
(training problems of the spec's task mix, by default the default mix, with their think-answer traces,
chat-template words, printable ASCII), so the same spec always gives the same vocabulary. Digits are split one per
token before the byte-level step, as Qwen2.5's tokenizer does. Special tokens come after the learned vocabulary (the
highest ids, as in Qwen2.5 and Llama 3); an optional BOS is added by the post-processor on `encode` (Llama 3), never
with `add_special_tokens=False`. The result is a `PreTrainedTokenizerFast` carrying its chat template.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from swarm_node import tasks
from swarm_node.tasks.traces import DEFAULT_TRACE_STYLE, think_answer_completion


@dataclass(frozen=True)
class BpeSpec:
    """What a tokenizer is built from; `special_tokens` get ids in this order after the learned vocabulary."""

    special_tokens: tuple[str, ...]
    eos_token: str
    chat_template: str
    bos_token: str | None = None  # also added on encode by the post-processor when set
    pad_token: str | None = None
    learned_vocab: int = 384  # byte alphabet (256) plus merges
    corpus_problems: int = 600
    corpus_seed: int = 4242
    corpus_mix: str = ""  # canonical JSON of the task mix the corpus draws from ("": tasks.DEFAULT_MIX)
    corpus_system: str = ""  # a system prompt that comes with each corpus problem, as the model will be prompted
    corpus_trace_style: str = DEFAULT_TRACE_STYLE  # how the corpus's think-answer traces are written (TRACE_STYLES)
    model_max_length: int = 2048


# Words the chat templates and instructions use, so they merge into few tokens like they would in a real vocabulary.
TEMPLATE_WORDS = ("system", "user", "assistant", "You are a helpful assistant.", "Cutting Knowledge Date",
                  "Today Date", "Think step by step", "answer", "think")
ASCII_TEXT = "".join(chr(c) for c in range(32, 127)) + "\n"


def training_corpus(problems: int, seed: int, mix: str = "", system: str = "",
                    trace_style: str = DEFAULT_TRACE_STYLE) -> Iterator[str]:
    """Deterministic text: printable ASCII, template words, and training problems (never held-out) of `mix`
    (canonical JSON; "": the default mix) with their think-answer completions in `trace_style`, each after `system`
    when given."""
    yield ASCII_TEXT
    yield from TEMPLATE_WORDS
    source = tasks.TaskSource(seed=seed, selection="balanced", mix=json.loads(mix) if mix else tasks.DEFAULT_MIX)
    for ref in source.draw(random.Random(seed), problems):
        inst = tasks.instance(ref)
        if system:
            yield system
        yield inst.question
        yield think_answer_completion(inst, trace_style)


def build_bpe_tokenizer(spec: BpeSpec) -> PreTrainedTokenizerFast:
    """A new tokenizer object for `spec` (the trained core is cached per process: building is deterministic)."""
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(trained_core(spec)),
                                        bos_token=spec.bos_token, eos_token=spec.eos_token, pad_token=spec.pad_token,
                                        model_max_length=spec.model_max_length)
    tokenizer.chat_template = spec.chat_template
    return tokenizer


@lru_cache(maxsize=8)
def trained_core(spec: BpeSpec) -> str:
    """The trained `tokenizers` core for `spec`, serialized."""
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=spec.learned_vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False, min_frequency=2)
    corpus = training_corpus(spec.corpus_problems, spec.corpus_seed, spec.corpus_mix, spec.corpus_system,
                             spec.corpus_trace_style)
    core.train_from_iterator(corpus, trainer)
    core.add_special_tokens([AddedToken(tok, special=True, normalized=False) for tok in spec.special_tokens])
    if spec.bos_token is not None:
        bos_id = core.token_to_id(spec.bos_token)
        core.post_processor = processors.TemplateProcessing(
            single=f"{spec.bos_token} $A", pair=f"{spec.bos_token} $A {spec.bos_token} $B:1",
            special_tokens=[(spec.bos_token, bos_id)])
    return core.to_str()

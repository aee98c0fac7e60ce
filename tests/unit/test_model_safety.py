"""What a node refuses to load (pickle weights, remote code, no tokenizer, EOS ids past the vocabulary), and
re-tokenizing a peer's text without special tokens (a receiver whose tokenizer adds a BOS, as Llama-3's does)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tokenizers.processors import TemplateProcessing
from transformers import PreTrainedTokenizerFast

from protocol.messages import CompletionWire, RolloutGroup, TaskRefWire
from swarm_node import tasks
from swarm_node.errors import UserError
from swarm_node.model.default_model import load_model, model_config
from swarm_node.model.tokenizer import build_char_tokenizer, tokenizer_hash
from swarm_node.sharing.rescore import CompletionBounds, ShareContext, accept_external

NOW = 1_700_000_000.0


def test_a_directory_of_pickle_weights_is_one_line_saying_how_to_convert(tiny_model_dir: Path,
                                                                         tmp_path: Path) -> None:
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    for f in tiny_model_dir.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, pickled / f.name)
    (pickled / "pytorch_model.bin").write_bytes(b"not to be unpickled")
    for load in (model_config, load_model):
        with pytest.raises(UserError, match=r"holds pickle weights only \(pytorch_model.bin\): swarm-node loads "
                                            r"safetensors only .*save_pretrained") as info:
            load(pickled)
        assert "\n" not in str(info.value)


def test_a_directory_without_a_tokenizer_is_one_line_naming_the_files_it_lacks(tiny_model_dir: Path,
                                                                               tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    shutil.copytree(tiny_model_dir, bare)
    for f in bare.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            f.unlink()
    with pytest.raises(UserError) as info:
        load_model(bare)
    assert str(info.value) == (f"model path {str(bare)!r} has no tokenizer (none of tokenizer.json, tokenizer.model, "
                               "vocab.json): copy the model's tokenizer files next to its config.json")


def test_an_eos_id_past_the_tokenizer_is_one_line_naming_generation_config(tiny_model_dir: Path,
                                                                           tmp_path: Path) -> None:
    model_dir = tmp_path / "eos"
    shutil.copytree(tiny_model_dir, model_dir)
    vocab = len(build_char_tokenizer())
    generation = model_dir / "generation_config.json"
    config = json.loads(generation.read_text()) if generation.exists() else {}
    generation.write_text(json.dumps({**config, "eos_token_id": [vocab - 1, vocab, 10**6]}))
    with pytest.raises(UserError) as info:
        load_model(model_dir)
    assert str(info.value) == (f"{generation}: eos_token_id [{vocab}, 1000000] outside the tokenizer's vocabulary of "
                               f"{vocab} tokens")


def test_a_model_that_needs_its_own_code_is_refused_without_running_it(tiny_model_dir: Path,
                                                                      tmp_path: Path) -> None:
    custom = tmp_path / "custom"
    shutil.copytree(tiny_model_dir, custom)
    marker = tmp_path / "ran"
    (custom / "configuration_evil.py").write_text(
        f"open({str(marker)!r}, 'w').write('x')\n"
        "from transformers import PretrainedConfig\n\n\nclass EvilConfig(PretrainedConfig):\n    model_type = 'evil'\n")
    config = (custom / "config.json").read_text()
    (custom / "config.json").write_text(config.replace(
        '"model_type": "qwen2"', '"model_type": "evil", "auto_map": {"AutoConfig": "configuration_evil.EvilConfig"}'))
    with pytest.raises(UserError, match="^cannot load a causal LM from"):
        model_config(custom)
    assert not marker.exists()


def bos_tokenizer() -> PreTrainedTokenizerFast:
    """The char tokenizer with a BOS the tokenizer adds to every encode (Llama-3's habit)."""
    tok = build_char_tokenizer()
    tok.add_special_tokens({"bos_token": "<bos>"})
    core = tok.backend_tokenizer
    core.post_processor = TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", tok.bos_token_id)])
    return tok


def test_a_receiver_whose_tokenizer_adds_a_bos_retokenizes_a_peers_text_without_it() -> None:
    tok = bos_tokenizer()
    assert tok.encode("12")[0] == tok.bos_token_id  # what `encode()` did to every completion of a peer
    source = tasks.TaskSource()
    ref = source.draw(__import__("random").Random(0), 1, turn=0)[0]
    inst = tasks.instance(ref)
    ctx = ShareContext(tok, tokenizer_hash(tok), source, CompletionBounds(16, 512, len(tok), 2))
    sender_hash = tokenizer_hash(build_char_tokenizer())  # another tokenizer: the text is re-tokenized
    completions = (CompletionWire((1, 2), inst.answer, (-0.1, -0.1), 1.0), CompletionWire((1, 2), "9999", (-0.1,) * 2,
                                                                                            0.0))
    wire = RolloutGroup(b"\x01" * 16, "peerA", 0, TaskRefWire(ref.dataset, ref.config, ref.seed, ref.index),
                        completions, sender_hash, "qwen2", NOW)
    out = accept_external(wire, "peerA", ctx, NOW)
    assert out.reason == "" and out.external is not None and out.external.retokenized
    first = out.external.group.completions[0]
    assert first.token_ids == (*tok.encode(inst.answer, add_special_tokens=False), tok.eos_token_id)
    assert tok.bos_token_id not in first.token_ids
    assert out.external.group.rewards == (1.0, 0.0) and out.malformed == 0

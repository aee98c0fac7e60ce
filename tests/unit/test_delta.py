"""Policy deltas: bit-exact round trips, error feedback by hand, late joiners, and every rejected input."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pickle
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from swarm_node.model.default_model import load_model
from swarm_node.policy_sync.codecs import read_header
from swarm_node.policy_sync.delta import (
    CODECS,
    DeltaError,
    IntegrityError,
    NonFiniteError,
    PayloadError,
    PayloadTooLarge,
    PolicyFollower,
    PolicyPublisher,
    PolicyUpdate,
    StaleUpdate,
    UnknownEncoding,
    VersionGap,
    model_state,
    state_hash,
)

ENCODINGS = sorted(CODECS)


def random_state(seed: int = 0) -> dict[str, torch.Tensor]:
    """A few tensors, one above 65536 entries so top-k indices span two blocks."""
    g = torch.Generator().manual_seed(seed)
    return {"emb": torch.randn(300, 250, generator=g), "w": torch.randn(16, 8, generator=g),
            "b": torch.randn(8, generator=g)}


def drift(state: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """One "training step": small updates of varied size, like Adam's."""
    g = torch.Generator().manual_seed(1000 + seed)
    return {n: t + 1e-3 * torch.randn(t.shape, generator=g) * torch.rand(t.shape, generator=g) ** 4
            for n, t in state.items()}


def forge(tensors: dict[str, torch.Tensor], *, version: int = 1, base_version: int = 0, encoding: str = "dense-bf16",
          state_sha256: str = "", metadata: dict[str, str] | None = None) -> PolicyUpdate:
    """A well-formed envelope (right sha256 and metadata) around arbitrary tensors: what a hostile peer can send."""
    meta = {"format": "swarm-node-policy/1", "encoding": encoding, "version": str(version),
            "base_version": str(base_version)} if metadata is None else metadata
    payload = save_safetensors(tensors, metadata=meta)
    return PolicyUpdate(version, base_version, encoding, payload, hashlib.sha256(payload).digest(), state_sha256)


def with_payload(update: PolicyUpdate, payload: bytes) -> PolicyUpdate:
    return dataclasses.replace(update, payload=payload, sha256=hashlib.sha256(payload).digest())


# -- hashing -----------------------------------------------------------------------------------------------------

def test_state_hash_is_the_documented_digest() -> None:
    state = {"b": torch.tensor([1.0, -2.0]), "a": torch.tensor([[0.5]], dtype=torch.bfloat16)}
    expected = hashlib.sha256(
        b"swarm-node-state/1\n"
        + b'["a", "torch.bfloat16", [1, 1], 2]\n' + bytes([0x00, 0x3F])  # bf16 0.5 = 0x3F00, little-endian
        + b'["b", "torch.float32", [2], 8]\n' + struct.pack("<2f", 1.0, -2.0)).hexdigest()
    assert state_hash(state) == expected
    assert state_hash(dict(reversed(state.items()))) == expected  # insertion order does not matter
    flipped = {"a": state["a"], "b": torch.tensor([1.0, -2.0000002])}
    assert state_hash(flipped) != expected
    assert state_hash({"a": state["a"], "b": state["b"].view(2, 1)}) != expected
    assert state_hash({"a": state["a"].float(), "b": state["b"]}) != expected


# -- round trips -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("encoding", ENCODINGS)
def test_chain_of_updates_is_bit_exact(encoding: str) -> None:
    w0 = random_state()
    publisher = PolicyPublisher(w0, encoding=encoding)
    follower = PolicyFollower(w0)
    assert follower.state_sha256 == publisher.state_sha256 == state_hash(w0)
    train = w0
    for step in range(1, 6):
        train = drift(train, step)
        update = publisher.publish(train)
        assert (update.version, update.base_version) == (step, step if encoding == "full" else step - 1)
        assert update.sha256 == hashlib.sha256(update.payload).digest() and update.size == len(update.payload)
        got = follower.apply(update)
        assert follower.version == step
        assert update.state_sha256 == state_hash(got) == publisher.state_sha256
        for name, t in publisher.published_state().items():
            assert torch.equal(t, got[name]), name
    if encoding == "full":  # a snapshot is W_train itself
        assert all(torch.equal(publisher.published_state()[n], t) for n, t in train.items())
    else:  # W_pub lags W_train by what the encoding has not sent yet; W_train is never touched
        assert any(not torch.equal(publisher.published_state()[n], t) for n, t in train.items())


def test_bf16_model_state_is_kept_in_fp32() -> None:
    w0 = {n: t.to(torch.bfloat16) for n, t in random_state().items()}
    publisher = PolicyPublisher(w0, encoding="dense-bf16")
    assert all(t.dtype == torch.float32 for t in publisher.published_state().values())
    assert publisher.state_sha256 == state_hash({n: t.float() for n, t in w0.items()})
    update = publisher.publish({n: t + 0.25 for n, t in w0.items()})
    assert PolicyFollower(w0).apply(update)["b"].dtype == torch.float32


def test_round_trip_on_a_model_and_in_another_process(tiny_model_dir: Path, tmp_path: Path) -> None:
    model, _ = load_model(tiny_model_dir)
    state = model_state(model)
    assert "lm_head.weight" not in state and "model.embed_tokens.weight" in state  # tied: sent once
    publisher = PolicyPublisher(state, encoding="topk", topk_fraction=0.05)
    torch.manual_seed(3)
    with torch.no_grad():
        for step in range(3):
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 1e-3)
            update = publisher.publish(model_state(model))
            (tmp_path / f"u{step}.st").write_bytes(update.payload)
            (tmp_path / f"u{step}.json").write_text(json.dumps({
                "version": update.version, "base_version": update.base_version, "encoding": update.encoding,
                "state_sha256": update.state_sha256}))
    # A follower in a fresh process, with other thread settings, reconstructs the same bits.
    script = f"""
import hashlib, json, torch
from swarm_node.policy_sync.delta import PolicyFollower, PolicyUpdate, model_state
from swarm_node.model.default_model import load_model
torch.set_num_threads(3)
follower = PolicyFollower(model_state(load_model({str(tiny_model_dir)!r})[0]))
for step in range(3):
    payload = open({str(tmp_path)!r} + f"/u{{step}}.st", "rb").read()
    fields = json.load(open({str(tmp_path)!r} + f"/u{{step}}.json"))
    follower.apply(PolicyUpdate(payload=payload, sha256=hashlib.sha256(payload).digest(), **fields))
print(follower.state_sha256)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == publisher.state_sha256
    # The published state loads back into the model through the tie.
    model.load_state_dict(publisher.published_state(), strict=False)
    assert torch.equal(model.lm_head.weight, publisher.published_state()["model.embed_tokens.weight"])


# -- error feedback, by hand -------------------------------------------------------------------------------------

def test_topk_keeps_the_largest_entries_and_carries_the_rest() -> None:
    w0 = {"x": torch.zeros(4)}
    train = {"x": torch.tensor([0.5, -3.0, 1.0 + 2**-10, 2.0])}
    # k = ceil(0.5 * 4) = 2 (whole_below=0: by default a tensor this small would go whole)
    publisher = PolicyPublisher(w0, encoding="topk", topk_fraction=0.5, whole_below=0)
    follower = PolicyFollower(w0)

    first = publisher.publish(train)
    sent = load_safetensors(first.payload)
    assert sent["x:index"].tolist() == [1, 3] and sent["x:values"].tolist() == [-3.0, 2.0]
    assert sent["x:values"].dtype == torch.bfloat16 and sent["x:blocks"].tolist() == [2]
    assert follower.apply(first)["x"].tolist() == [0.0, -3.0, 0.0, 2.0]

    # The two entries left out are now the largest residual; 1 + 2^-10 rounds to 1.0 in bf16 (7 mantissa bits).
    second = publisher.publish(train)
    sent = load_safetensors(second.payload)
    assert sent["x:index"].tolist() == [0, 2] and sent["x:values"].tolist() == [0.5, 1.0]
    assert follower.apply(second)["x"].tolist() == [0.5, -3.0, 1.0, 2.0]

    # The rounding error 2^-10 (exact in bf16) goes out next: W_pub reaches W_train exactly.
    third = publisher.publish(train)
    assert 2**-10 in load_safetensors(third.payload)["x:values"].tolist()
    assert torch.equal(follower.apply(third)["x"], train["x"])
    assert follower.state_sha256 == publisher.state_sha256 == state_hash(train)


def test_dense_bf16_carries_its_rounding_error() -> None:
    w0 = {"x": torch.tensor([1.0, 0.0])}
    train = {"x": torch.tensor([2.0 + 2**-8, -2**-20])}  # residual 1 + 2^-8: halfway between bf16 1.0 and
    # 1.0078125, rounds to even 1.0; -2^-20 is exact in bf16
    publisher = PolicyPublisher(w0, encoding="dense-bf16")
    first = publisher.publish(train)
    assert load_safetensors(first.payload)["x"].tolist() == [1.0, -2**-20]
    assert publisher.published_state()["x"].tolist() == [2.0, -2**-20]
    second = publisher.publish(train)
    assert load_safetensors(second.payload)["x"].tolist() == [2**-8, 0.0]
    assert torch.equal(publisher.published_state()["x"], train["x"])


def test_topk_payload_costs_four_bytes_per_kept_entry() -> None:
    w0 = random_state()
    update = PolicyPublisher(w0, encoding="topk", topk_fraction=0.01).publish(drift(w0, 1))
    specs, meta = read_header(update.payload)
    header = int.from_bytes(update.payload[:8], "little")
    # k = ceil(0.01 n) = 750 of 75000 (two blocks of 65536); w (128) and b (8) are under whole_below: sent whole
    assert {n: s.shape for n, s in specs.items()} == {
        "emb:values": (750,), "emb:index": (750,), "emb:blocks": (2,), "w:values": (128,), "w:index": (128,),
        "w:blocks": (1,), "b:values": (8,), "b:index": (8,), "b:blocks": (1,)}
    assert update.size - 8 - header == (750 + 128 + 8) * 4 + 4 * 4
    assert (meta["encoding"], meta["option.topk_fraction"], meta["option.whole_below"]) == ("topk", "0.01", "4096")


# -- late joiners ------------------------------------------------------------------------------------------------

def test_late_joiner_takes_a_snapshot_then_deltas() -> None:
    w0 = random_state()
    publisher = PolicyPublisher(w0, encoding="topk", keep=3)
    early = PolicyFollower(w0)
    train = w0
    for step in range(1, 11):
        train = drift(train, step)
        update = publisher.publish(train)
        if step <= 8:
            early.apply(update)
    assert publisher.updates_from(0) is None  # v1..v7 are no longer kept: send a snapshot
    assert publisher.updates_from(-1) is None
    assert [u.version for u in publisher.updates_from(8)] == [9, 10]
    assert publisher.updates_from(10) == [] and publisher.updates_from(11) is None
    for update in publisher.updates_from(early.version):
        early.apply(update)
    assert early.state_sha256 == publisher.state_sha256

    joiner = PolicyFollower(shapes={n: tuple(t.shape) for n, t in w0.items()})
    assert joiner.version == -1
    with pytest.raises(VersionGap):
        joiner.apply(publisher.get(10))
    snap = publisher.snapshot()
    assert (snap.version, snap.base_version, snap.encoding) == (10, 10, "full") and snap is publisher.snapshot()
    joiner.apply(snap)
    for step in (11, 12):
        train = drift(train, step)
        joiner.apply(publisher.publish(train))
    assert joiner.state_sha256 == publisher.state_sha256

    # The joiner serves what it has: its snapshot and the deltas after it.
    second = PolicyFollower()
    chain = joiner.updates_from(-1)
    assert [(u.version, u.base_version) for u in chain] == [(10, 10), (11, 10), (12, 11)]
    for update in chain:
        second.apply(update)
    assert second.state_sha256 == publisher.state_sha256
    assert [u.version for u in joiner.updates_from(11)] == [12]


# -- rejected inputs ---------------------------------------------------------------------------------------------

def _dense_tensors(w0: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {n: torch.full_like(t, 0.125, dtype=torch.bfloat16) for n, t in w0.items()}


def _topk_tensors(index: list[int], blocks: list[int]) -> dict[str, torch.Tensor]:
    tensors = {"w:values": torch.ones(1, dtype=torch.bfloat16), "w:index": torch.zeros(1, dtype=torch.uint16),
               "w:blocks": torch.tensor([1], dtype=torch.int32), "b:values": torch.ones(1, dtype=torch.bfloat16),
               "b:index": torch.zeros(1, dtype=torch.uint16), "b:blocks": torch.tensor([1], dtype=torch.int32)}
    emb = 300 * 250
    tensors.update({"emb:values": torch.ones(len(index), dtype=torch.bfloat16),
                    "emb:index": torch.tensor(index, dtype=torch.int32).to(torch.uint16),
                    "emb:blocks": torch.tensor(blocks, dtype=torch.int32)})
    assert emb > 65536
    return tensors


def _bad_updates(good: PolicyUpdate, w0: dict[str, torch.Tensor]) -> dict[str, tuple[PolicyUpdate, type]]:
    dense = _dense_tensors(w0)
    nan = dict(dense, b=torch.tensor([float("nan")] + [0.0] * 7, dtype=torch.bfloat16))
    return {
        "wrong sha256": (dataclasses.replace(good, sha256=bytes(32)), IntegrityError),
        "flipped payload byte": (dataclasses.replace(good, payload=good.payload[:-1] + b"\x00"), IntegrityError),
        "truncated payload": (with_payload(good, good.payload[:-10]), PayloadError),
        "pickle payload": (with_payload(good, pickle.dumps({"b": [0.0] * 8})), PayloadError),
        "empty payload": (with_payload(good, b""), PayloadError),
        "wrong base version": (dataclasses.replace(good, version=3, base_version=2), VersionGap),
        "stale version": (dataclasses.replace(good, version=0, base_version=-1), StaleUpdate),
        "unknown encoding": (dataclasses.replace(good, encoding="zstd-magic"), UnknownEncoding),
        "snapshot encoding on a delta": (dataclasses.replace(good, encoding="full"), PayloadError),
        "metadata disagrees": (forge(dense, metadata={"format": "swarm-node-policy/1", "encoding": "dense-bf16",
                                                      "version": "7", "base_version": "0"}), IntegrityError),
        "wrong state hash": (forge(dense, state_sha256="0" * 64), IntegrityError),
        "wrong tensor name": (forge({("B" if n == "b" else n): t for n, t in dense.items()}), PayloadError),
        "missing tensor": (forge({n: t for n, t in dense.items() if n != "w"}), PayloadError),
        "wrong shape": (forge(dict(dense, w=torch.zeros(8, 16, dtype=torch.bfloat16))), PayloadError),
        "wrong dtype": (forge(dict(dense, w=torch.zeros(16, 8))), PayloadError),
        "NaN in payload": (forge(nan), NonFiniteError),
        "topk duplicate index": (forge(_topk_tensors([5, 5], [2, 0]), encoding="topk"), PayloadError),
        "topk unsorted index": (forge(_topk_tensors([9, 5], [2, 0]), encoding="topk"), PayloadError),
        "topk index past the end": (forge(_topk_tensors([5, 65535], [1, 1]), encoding="topk"), PayloadError),
        "topk counts disagree": (forge(_topk_tensors([5, 6], [1, 0]), encoding="topk"), PayloadError),
        "topk more values than entries": (forge(dict(_topk_tensors([5], [1, 0]), **{
            "b:values": torch.ones(9, dtype=torch.bfloat16), "b:index": torch.zeros(9, dtype=torch.uint16),
            "b:blocks": torch.tensor([9], dtype=torch.int32)}), encoding="topk"), PayloadError),
        "snapshot with a wrong shape": (forge(dict(w0, w=torch.zeros(3)), version=1, base_version=1,
                                              encoding="full"), PayloadError),
    }


def test_every_bad_input_is_rejected_and_leaves_the_state_unchanged() -> None:
    w0 = {n: t * 1e-3 for n, t in random_state().items()}
    publisher = PolicyPublisher(w0, encoding="dense-bf16")
    good = publisher.publish(drift(w0, 1))
    follower = PolicyFollower(w0)
    before = follower.state_sha256
    bad = _bad_updates(good, w0)
    for reason, (update, error) in bad.items():
        with pytest.raises(error):
            follower.apply(update)
        assert (follower.version, follower.state_sha256) == (0, before), reason
        assert follower.get(update.version) is None and state_hash(follower.published_state()) == before, reason
    assert issubclass(VersionGap, DeltaError) and all(issubclass(e, DeltaError) for _, e in bad.values())
    follower.apply(good)  # and the genuine update still goes through
    assert follower.state_sha256 == publisher.state_sha256
    with pytest.raises(StaleUpdate):
        follower.apply(good)


def test_version_gap_says_what_is_missing() -> None:
    w0 = random_state()
    publisher = PolicyPublisher(w0, encoding="dense-bf16")
    publisher.publish(drift(w0, 1))
    second = publisher.publish(drift(w0, 2))
    with pytest.raises(VersionGap) as info:
        PolicyFollower(w0).apply(second)
    assert (info.value.have, info.value.need) == (0, 1)


def test_oversized_payload_is_rejected_before_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    w0 = random_state()
    update = PolicyPublisher(w0, encoding="dense-bf16").publish(drift(w0, 1))
    follower = PolicyFollower(w0, max_payload_bytes=update.size - 1)
    hashed: list[bytes] = []
    real = hashlib.sha256
    monkeypatch.setattr(hashlib, "sha256", lambda data=b"": hashed.append(data) or real(data))
    with pytest.raises(PayloadTooLarge):
        follower.apply(update)
    assert hashed == [] and follower.version == 0
    monkeypatch.undo()
    # The default guard is the largest valid payload for the state: a snapshot-sized blob plus header room.
    assert PolicyFollower(w0).max_payload_bytes >= PolicyPublisher(w0).snapshot().size


def test_publisher_rejects_a_train_state_of_another_model() -> None:
    w0 = random_state()
    publisher = PolicyPublisher(w0)
    with pytest.raises(ValueError, match="does not match"):
        publisher.publish(dict(w0, w=torch.zeros(8, 16)))
    with pytest.raises(NonFiniteError):
        publisher.publish(dict(w0, b=torch.full((8,), float("nan"))))
    with pytest.raises(UnknownEncoding):
        PolicyPublisher(w0, encoding="nope")
    with pytest.raises(ValueError):
        PolicyPublisher(w0, encoding="topk", topk_fraction=0.0)
    assert publisher.version == 0


def test_a_delta_that_overflows_to_inf_is_rejected() -> None:
    w0 = {"x": torch.tensor([3e38, 1.0])}
    follower = PolicyFollower(w0)
    for encoding, tensors in {
        "dense-bf16": {"x": torch.tensor([3e38, 0.0], dtype=torch.bfloat16)},
        "topk": {"x:values": torch.tensor([3e38], dtype=torch.bfloat16), "x:index": torch.zeros(1, dtype=torch.uint16),
                 "x:blocks": torch.ones(1, dtype=torch.int32)},
    }.items():
        with pytest.raises(NonFiniteError, match="result"):
            follower.apply(forge(tensors, encoding=encoding))
    assert follower.state_sha256 == state_hash(w0)


def test_codec_registry_holds_the_documented_encodings() -> None:
    assert {"full", "dense-bf16", "topk"} <= set(CODECS)
    assert [CODECS[n]().snapshot for n in ("full", "dense-bf16", "topk")] == [True, False, False]

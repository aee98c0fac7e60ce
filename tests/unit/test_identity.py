"""Identity: key file format, 0600 permissions, stable peer id, refusal of bad or exposed files."""

from __future__ import annotations

import os
import stat

import pytest

from swarm_node import identity
from swarm_node.errors import UserError

# RFC 8032 section 7.1, test 1: secret key (seed) and its public key.
RFC8032_SEED = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
RFC8032_PUBLIC = bytes.fromhex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")


def test_public_key_and_signature_match_rfc8032() -> None:
    ident = identity.generate(RFC8032_SEED)
    assert ident.public_key == RFC8032_PUBLIC
    # RFC 8032 test 1 signs the empty message.
    assert ident.sign(b"").hex() == (
        "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"
    )


def test_key_file_bytes_are_libp2p_protobuf() -> None:
    ident = identity.generate(RFC8032_SEED)
    # field 1 (key_type) varint 1 = Ed25519; field 2 (data) length 32.
    assert ident.to_bytes() == bytes([0x08, 0x01, 0x12, 0x20]) + RFC8032_SEED


def test_peer_id_is_base58_identity_multihash() -> None:
    ident = identity.generate(RFC8032_SEED)
    multihash = bytes([0x00, 36, 0x08, 0x01, 0x12, 0x20]) + RFC8032_PUBLIC
    assert ident.peer_id == identity.base58btc(multihash)
    assert ident.peer_id.startswith("12D3KooW")  # every Ed25519 libp2p peer id does


def test_base58_hand_values() -> None:
    assert identity.base58btc(b"") == ""
    assert identity.base58btc(b"\x00") == "1"
    assert identity.base58btc(b"\x00\x00\x39") == "11z"  # 57 -> 'z', two leading zero bytes -> '11'
    assert identity.base58btc(b"\x3a") == "21"  # 58 = 1*58 + 0


def test_matches_py_libp2p() -> None:
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.crypto.serialization import deserialize_private_key
    from libp2p.peer.id import ID

    ident = identity.generate(RFC8032_SEED)
    key_pair = create_new_key_pair(RFC8032_SEED)
    assert ident.peer_id == ID.from_pubkey(key_pair.public_key).to_base58()
    assert ident.to_bytes() == key_pair.private_key.serialize()
    assert deserialize_private_key(ident.to_bytes()).to_bytes() == RFC8032_SEED


def test_save_load_round_trip_with_0600(tmp_path) -> None:
    path = tmp_path / "sub" / "identity.key"
    ident = identity.keygen(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert identity.load(path) == ident
    assert identity.load_or_create(path).peer_id == ident.peer_id  # stable across restarts
    assert [p.name for p in path.parent.iterdir()] == ["identity.key"]  # no temp file left behind


def test_load_or_create_creates_once(tmp_path) -> None:
    path = tmp_path / "run" / identity.IDENTITY_FILENAME
    first = identity.load_or_create(path)
    second = identity.load_or_create(path)
    assert first.peer_id == second.peer_id


def test_keygen_refuses_to_overwrite(tmp_path) -> None:
    path = tmp_path / "identity.key"
    ident = identity.keygen(path)
    with pytest.raises(UserError, match="already exists"):
        identity.keygen(path)
    assert identity.load(path) == ident
    replaced = identity.keygen(path, overwrite=True)
    assert identity.load(path) == replaced != ident


def test_load_refuses_exposed_file(tmp_path) -> None:
    path = tmp_path / "identity.key"
    identity.keygen(path)
    os.chmod(path, 0o644)
    with pytest.raises(UserError, match="chmod 600"):
        identity.load(path)


def test_load_missing_file(tmp_path) -> None:
    with pytest.raises(UserError, match="does not exist"):
        identity.load(tmp_path / "nope.key")


@pytest.mark.parametrize("blob, reason", [
    (b"", "missing key type"),
    (bytes([0x08, 0x00, 0x12, 0x20]) + bytes(32), "key type 0"),  # RSA
    (bytes([0x08, 0x01, 0x12, 0x10]) + bytes(16), "16 bytes"),
    (bytes([0x08, 0x01, 0x12, 0x20]) + bytes(31), "truncated"),
    (b"\xff" * 10, "unexpected byte"),
    (bytes([0x08, 0x01, 0x12, 0x40]) + RFC8032_SEED + bytes(32), "does not match"),
])
def test_load_rejects_invalid_keys(tmp_path, blob: bytes, reason: str) -> None:
    path = tmp_path / "identity.key"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, blob)
    os.close(fd)
    with pytest.raises(UserError, match=reason):
        identity.load(path)


def test_accepts_go_libp2p_64_byte_key() -> None:
    blob = bytes([0x08, 0x01, 0x12, 0x40]) + RFC8032_SEED + RFC8032_PUBLIC
    assert identity.Identity.from_bytes(blob) == identity.generate(RFC8032_SEED)

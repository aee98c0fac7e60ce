"""Persistent Ed25519 node identity: generate, save (mode 0600), load, peer id.

Contract:
- `generate()` makes a fresh Ed25519 key; `Identity.peer_id` is the libp2p peer id string ("12D3KooW...",
  an identity multihash of the protobuf public key), so the same key file gives the same peer id on every start.
- The key file holds the libp2p protobuf `PrivateKey` (key_type Ed25519, 32-byte seed), the canonical libp2p
  serialization; a 64-byte go-libp2p style payload (seed || public key) is accepted on load as well.
- `save()` writes atomically with mode 0600 and refuses to overwrite unless asked; `load()` refuses a key file that
  group or others may read (like ssh) and any file that is not a valid Ed25519 key, with a one-line UserError.
- `keygen(path)` is the body of `swarm-node keygen [PATH]`; `load_or_create(path)` is what `--identity PATH`
  (default inside the run dir) does at start.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from google.protobuf.message import DecodeError
from libp2p.crypto.ed25519 import Ed25519PrivateKey
from libp2p.crypto.keys import KeyPair, KeyType, PrivateKey
from libp2p.peer.id import ID

from swarm_node.errors import UserError

SEED_BYTES = 32
IDENTITY_FILENAME = "identity.key"


@dataclass(frozen=True)
class Identity:
    """An Ed25519 private key and the libp2p peer id derived from it."""

    private_key: PrivateKey

    @property
    def key_pair(self) -> KeyPair:
        return KeyPair(self.private_key, self.private_key.get_public_key())

    @property
    def peer_id(self) -> str:
        return ID.from_pubkey(self.private_key.get_public_key()).to_base58()

    def to_bytes(self) -> bytes:
        """The key file content: libp2p protobuf PrivateKey (Ed25519, 32-byte seed)."""
        return self.private_key.serialize()

    @classmethod
    def from_bytes(cls, data: bytes) -> Identity:
        """Parse a key file's content; ValueError when it is not an Ed25519 private key."""
        try:
            proto = PrivateKey.deserialize_from_protobuf(data)
        except DecodeError as exc:
            raise ValueError(f"not a libp2p private key ({type(exc).__name__})") from exc
        if proto.key_type != KeyType.Ed25519.value:
            raise ValueError(f"key type {proto.key_type} is not Ed25519 ({KeyType.Ed25519.value})")
        raw = bytes(proto.data)
        if len(raw) == 2 * SEED_BYTES:
            # go-libp2p stores seed || public key; keep the seed and check the public half matches it.
            key = Ed25519PrivateKey.from_bytes(raw[:SEED_BYTES])
            if key.get_public_key().to_bytes() != raw[SEED_BYTES:]:
                raise ValueError("64-byte Ed25519 key whose public half does not match its seed")
            return cls(key)
        if len(raw) != SEED_BYTES:
            raise ValueError(f"Ed25519 key of {len(raw)} bytes (want {SEED_BYTES} or {2 * SEED_BYTES})")
        return cls(Ed25519PrivateKey.from_bytes(raw))


def generate(seed: bytes | None = None) -> Identity:
    """A fresh identity; `seed` (32 bytes) makes it deterministic, for tests and simulations."""
    if seed is not None and len(seed) != SEED_BYTES:
        raise ValueError(f"seed must be {SEED_BYTES} bytes, got {len(seed)}")
    return Identity(Ed25519PrivateKey.new(seed))


def save(identity: Identity, path: Path, *, overwrite: bool = False) -> None:
    """Write the key file with mode 0600 (atomically: temp file in the same directory, then rename)."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise UserError(f"identity file {path} already exists; refusing to overwrite it")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    # O_EXCL + mode 0600 at creation: the key is never readable by others, not even for an instant.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(identity.to_bytes())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def load(path: Path) -> Identity:
    """Read a key file written by `save` (or by go-libp2p); UserError for a missing, exposed or invalid file."""
    path = Path(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise UserError(f"identity file {path} does not exist (create one with `swarm-node keygen {path}`)") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise UserError(f"identity file {path} is accessible by other users (mode {stat.S_IMODE(st.st_mode):o}); "
                        f"run `chmod 600 {path}`")
    try:
        return Identity.from_bytes(path.read_bytes())
    except ValueError as exc:
        raise UserError(f"identity file {path} is not a valid Ed25519 key: {exc}") from None


def load_or_create(path: Path) -> Identity:
    """The identity at `path`, created (0600) on first use so the peer id is stable across restarts."""
    path = Path(path)
    if path.exists():
        return load(path)
    identity = generate()
    save(identity, path)
    return identity


def keygen(path: Path, *, overwrite: bool = False) -> Identity:
    """`swarm-node keygen PATH`: create a new identity file and return it (the CLI prints its peer id)."""
    identity = generate()
    save(identity, path, overwrite=overwrite)
    return identity

"""Persistent Ed25519 node identity: generate, save (mode 0600), load, libp2p peer id.

Contract:
- `generate()` makes a fresh Ed25519 key; `Identity.peer_id` is its libp2p peer id ("12D3KooW...": base58btc of
  the identity multihash of the protobuf public key), so the same key file gives the same peer id on every start.
- The key file holds the libp2p protobuf `PrivateKey` {key_type: Ed25519 (1), data: 32-byte seed}, exactly what
  py-libp2p's `PrivateKey.serialize()` writes; go-libp2p's 64-byte data (seed || public key) is accepted too.
- `save()` writes atomically with mode 0600 and refuses to overwrite unless asked; `load()` refuses a key file that
  group or others may access (like ssh) and any file that is not a valid Ed25519 key, with a one-line UserError.
- `keygen(path)` is the body of `swarm-node keygen [PATH]`; `load_or_create(path)` is what `--identity PATH`
  (default inside the run dir) does at start.
Built on PyNaCl with the few bytes of libp2p encoding written out here, so the node process never imports
py-libp2p (its network host runs in a child process); tests check the results against py-libp2p itself.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from nacl.signing import SigningKey

from swarm_node.errors import UserError

SEED_BYTES = 32
ED25519_KEY_TYPE = 1  # libp2p crypto.proto KeyType.Ed25519
IDENTITY_FILENAME = "identity.key"
_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def base58btc(data: bytes) -> str:
    """Bitcoin-alphabet base58 (leading zero bytes become '1's), as libp2p prints peer ids."""
    n = int.from_bytes(data, "big")
    out = ""
    while n:
        n, rem = divmod(n, 58)
        out = _B58[rem] + out
    return "1" * (len(data) - len(data.lstrip(b"\0"))) + out


def _key_proto(data: bytes) -> bytes:
    """libp2p crypto.proto {Type: Ed25519, Data: data}: field 1 varint, field 2 length-delimited."""
    if len(data) > 127:
        raise ValueError("key data too long for a one-byte length")
    return bytes([0x08, ED25519_KEY_TYPE, 0x12, len(data)]) + data


def _parse_key_proto(blob: bytes) -> tuple[int, bytes]:
    """(key_type, data) of a crypto.proto PrivateKey; ValueError for anything else."""
    fields: dict[int, int | bytes] = {}
    i = 0
    while i < len(blob):
        tag = blob[i]
        i += 1
        if tag == 0x08 and i < len(blob) and blob[i] < 0x80 and 1 not in fields:
            fields[1] = blob[i]
            i += 1
        elif tag == 0x12 and i < len(blob) and blob[i] < 0x80 and 2 not in fields:
            length = blob[i]
            if i + 1 + length > len(blob):
                raise ValueError("truncated key data")
            fields[2] = blob[i + 1:i + 1 + length]
            i += 1 + length
        else:
            raise ValueError(f"unexpected byte 0x{tag:02x} at offset {i - 1}")
    key_type, data = fields.get(1), fields.get(2)
    if not isinstance(key_type, int) or not isinstance(data, bytes):
        raise ValueError("missing key type or key data")
    return key_type, data


@dataclass(frozen=True)
class Identity:
    """An Ed25519 private key (its 32-byte seed) and the libp2p peer id derived from it."""

    seed: bytes

    def __post_init__(self) -> None:
        if len(self.seed) != SEED_BYTES:
            raise ValueError(f"Ed25519 seed must be {SEED_BYTES} bytes, got {len(self.seed)}")

    @property
    def public_key(self) -> bytes:
        return bytes(SigningKey(self.seed).verify_key)

    @property
    def peer_id(self) -> str:
        public_proto = _key_proto(self.public_key)
        return base58btc(bytes([0x00, len(public_proto)]) + public_proto)  # identity multihash: code 0, length

    def sign(self, data: bytes) -> bytes:
        return SigningKey(self.seed).sign(data).signature

    def to_bytes(self) -> bytes:
        """The key file content: libp2p protobuf PrivateKey (Ed25519, 32-byte seed)."""
        return _key_proto(self.seed)

    @classmethod
    def from_bytes(cls, blob: bytes) -> Identity:
        """Parse a key file's content; ValueError when it is not an Ed25519 private key."""
        key_type, data = _parse_key_proto(blob)
        if key_type != ED25519_KEY_TYPE:
            raise ValueError(f"key type {key_type} is not Ed25519 ({ED25519_KEY_TYPE})")
        if len(data) == 2 * SEED_BYTES:
            # go-libp2p stores seed || public key; keep the seed and check the public half matches it.
            identity = cls(data[:SEED_BYTES])
            if identity.public_key != data[SEED_BYTES:]:
                raise ValueError("64-byte Ed25519 key whose public half does not match its seed")
            return identity
        if len(data) != SEED_BYTES:
            raise ValueError(f"Ed25519 key of {len(data)} bytes (want {SEED_BYTES} or {2 * SEED_BYTES})")
        return cls(data)


def generate(seed: bytes | None = None) -> Identity:
    """A fresh identity; `seed` (32 bytes) makes it deterministic, for tests and simulations."""
    return Identity(seed if seed is not None else bytes(SigningKey.generate()))


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
    """Read a key file written by `save` (or go-libp2p); UserError for a missing, exposed or invalid file."""
    path = Path(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise UserError(f"identity file {path} does not exist (create it: swarm-node keygen {path})") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise UserError(f"identity file {path} is accessible by other users "
                        f"(mode {stat.S_IMODE(st.st_mode):o}); run: chmod 600 {path}")
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

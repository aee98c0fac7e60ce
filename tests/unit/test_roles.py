"""roles/: the ROLES registry, and the wiring every role shares (wire limits, published model family)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from protocol.messages import RolloutGroup
from swarm_node import variants
from swarm_node.config import load_config
from swarm_node.node.assembly import Assembly, Sharing, assemble
from swarm_node.node.core import NodeEvents
from swarm_node.node.run_files import RunSummary
from swarm_node.status.stats import NodeStats
from swarm_node.types import Draft


def test_every_declared_role_is_registered() -> None:
    from swarm_node.roles import ROLES

    assert sorted(ROLES) == sorted(variants.ROLES)
    with pytest.raises(KeyError, match="choose one of peer, learner, worker"):
        ROLES["boss"]


def _cfg(tiny_model_dir: Path, tmp_path: Path, **extra: object) -> Any:
    return load_config(None, {"model.path": str(tiny_model_dir), "sampler.kind": "hf", "run.steps": 1,
                              "run.prompts_per_step": 2, "run.group_size": 4, "run.eval_problems": 0,
                              "run.run_dir": str(tmp_path / "run"), "train.threads": 1, "status.port": -1,
                              "task.reward": "score", **extra})


class FakeNet:
    """A BackgroundTransport stand-in: nothing runs; coroutines handed to `call` are closed unawaited."""

    def __init__(self) -> None:
        self.transport = SimpleNamespace(peer_id="me")

    def call(self, fn: Callable[[object], Awaitable[object]], timeout: float | None = 60.0) -> None:
        coro = fn(self.transport)
        getattr(coro, "close", lambda: None)()

    def stop(self) -> None:
        pass


def test_sapo_join_path_bounds_token_ids_by_the_node_vocabulary(tiny_model_dir: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Drift (a): the SAPO join path built `Limits()` without the vocabulary the echo and simulation paths pass."""
    from swarm_node.roles import ROLES, wiring

    monkeypatch.setattr(wiring, "start_libp2p", lambda cfg, stats, events: (SimpleNamespace(peer_id="me"),
                                                                             FakeNet()))
    seen: dict[str, int | None] = {}

    def run(self: Assembly) -> RunSummary:
        assert self.exchange is not None
        seen["vocab_size"] = self.exchange.limits.vocab_size
        seen["ours"] = len(self.node.tokenizer)
        return RunSummary(0, None, None, None, self.node.run_dir, 0)

    monkeypatch.setattr(Assembly, "run", run)
    ROLES["peer"](_cfg(tiny_model_dir, tmp_path), NodeStats(), NodeEvents(log=lambda _m: None))
    assert seen["vocab_size"] == seen["ours"] and seen["ours"]


def test_workers_publish_the_model_family_like_peers(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Drift (b): workers published rollout groups with family "" while peers published the model type."""
    from swarm_node.roles.worker import publish_draft

    peer_sent: list[RolloutGroup] = []
    assembly = assemble(_cfg(tiny_model_dir, tmp_path), Sharing.SAPO, transport=SimpleNamespace(peer_id="peer1"),  # type: ignore[arg-type]
                        events=NodeEvents(log=lambda _m: None),
                        outbox=lambda _ex: SimpleNamespace(peer_id="peer1", publish=peer_sent.extend, drain=list))  # type: ignore[arg-type,return-value]
    node = assembly.node
    try:
        groups, gen_s, tokens = node.generate_groups()
        sent: list[RolloutGroup] = []
        outbox = SimpleNamespace(publish=sent.extend)
        assert assembly.signer is not None
        publish_draft(assembly.signer, outbox, "learner", "worker1",  # type: ignore[arg-type]
                      Draft(groups, gen_s, tokens, time.monotonic(), 3), batch=1)
        assembly.sample_and_share()
    finally:
        assembly.close()
    family = node.model.config.model_type
    assert family and len(sent) == len(groups)
    assert {g.model_family for g in sent} == {g.model_family for g in peer_sent} == {family}
    assert {(g.policy_id, g.policy_version) for g in sent} == {("learner", 3)}
    assert {g.tokenizer_hash for g in sent} == {node.tokenizer_hash}


@pytest.mark.parametrize(("given", "peer_ids"), [(None, ("peerA", "peerB")), (7, ("peerA", "peerB"))])
def test_a_joined_node_without_a_seed_derives_it_from_its_identity(tiny_model_dir: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch, given: int | None,
                                                                   peer_ids: tuple[str, str]) -> None:
    """Two peers left at the defaults drew the same task indices and produced byte-identical groups; a seed given
    on the command line still reproduces a run exactly."""
    from swarm_node.node.build import identity_seed
    from swarm_node.roles import ROLES, wiring

    seen: dict[str, tuple[int | None, list[tuple[str, int]]]] = {}
    for peer_id in peer_ids:
        monkeypatch.setattr(wiring, "start_libp2p", lambda cfg, stats, events, p=peer_id: (
            SimpleNamespace(peer_id=p), FakeNet()))

        def run(self: Assembly, p: str = peer_id) -> RunSummary:
            draft = self.node.draft()
            assert isinstance(draft, Draft)
            seen[p] = (self.node.cfg.run.seed, [(g.inst.ref.dataset, g.inst.ref.index) for g in draft.groups])
            return RunSummary(0, None, None, None, self.node.run_dir, 0)

        monkeypatch.setattr(Assembly, "run", run)
        extra = {"run.seed": given} if given is not None else {}
        ROLES["peer"](_cfg(tiny_model_dir, tmp_path / peer_id, **extra), NodeStats(), NodeEvents(log=lambda _m: None))
    (seed_a, draws_a), (seed_b, draws_b) = seen["peerA"], seen["peerB"]
    if given is None:
        assert (seed_a, seed_b) == (identity_seed("peerA"), identity_seed("peerB")) and seed_a != seed_b
        assert draws_a != draws_b
    else:
        assert seed_a == seed_b == 7 and draws_a == draws_b


def test_identity_seed_is_31_bits_of_the_peer_ids_hash() -> None:
    import hashlib

    from swarm_node.config import NodeConfig
    from swarm_node.node.build import identity_seed, seeded

    digest = hashlib.sha256(b"12D3KooWExample").digest()
    assert identity_seed("12D3KooWExample") == int.from_bytes(digest[:4], "little") & 0x7FFFFFFF
    assert NodeConfig().run.seed is None and seeded(NodeConfig()).run.seed == 0
    assert seeded(NodeConfig(), "12D3KooWExample").run.seed == identity_seed("12D3KooWExample")
    assert seeded(NodeConfig().with_values({"run.seed": 3}), "12D3KooWExample").run.seed == 3

"""What a bounded fan-in node serves: its groups of recent rounds, by the round their digest announced.

Contract (no I/O; times are passed in). Peers' rounds are not in step with ours (a round is one training step, and
nodes step at their own pace), so a round's groups stay served after the round: `open_round(index, groups, now)`
keeps the previous round, and older ones while their digest is younger than `serve_for_s`, at most `serve_rounds`
rounds in all (what we hold is bounded). `wire(round, group_id)`: a held group's canonical encoding (`encode_group`:
what its digest's hash covers and a pull carries), made once when its round opens, not once per requester.
`request(requester, round, group_id)` answers SERVE, or a refusal:
UNOFFERED (scored) for an id the round we hold did not announce or a round we have not reached, NOT_HELD (not
scored, on either side) for a round we no longer hold: a slow requester asked too late, nobody lied. SERVE,
OVER_PULL and BUSY come from one `ServeBook` over every round held: its per-requester cap counts per announcing round
(a requester out of step takes its share of each digest batch once), its per-round cap per round of ours, so our
outbound pulls stay bounded however many rounds we hold.
"""

from __future__ import annotations

from protocol.codec import encode_group
from protocol.messages import RolloutGroup
from swarm_node.sharing.fanin import FanInParams
from swarm_node.sharing.fanin_ledger import NOT_HELD, UNOFFERED, ServeBook


class ServedRounds:
    def __init__(self, params: FanInParams) -> None:
        self.params = params
        self.current = -1
        self._rounds: dict[int, tuple[float, dict[bytes, RolloutGroup]]] = {}  # round -> (digest time, groups)
        self._wire: dict[int, dict[bytes, bytes]] = {}  # round -> group id -> encode_group(group)
        self.book = ServeBook(params)

    def open_round(self, round_index: int, groups: list[RolloutGroup], now: float) -> dict[bytes, bytes]:
        """Hold `groups` as round `round_index`; returns their encodings by group id (`wire`)."""
        p = self.params
        kept = {r: v for r, v in self._rounds.items() if r == self.current or now - v[0] < p.serve_for_s}
        newest = sorted(kept, reverse=True)[:p.serve_rounds - 1]
        self._rounds = {r: kept[r] for r in newest}
        self._rounds[round_index] = (now, {g.group_id: g for g in groups})
        self._wire = {r: self._wire[r] for r in newest if r in self._wire}
        self._wire[round_index] = {g.group_id: encode_group(g) for g in groups}
        self.current = round_index
        self.book.new_round({gid.hex() for _, held in self._rounds.values() for gid in held}, set(self._rounds))
        return self._wire[round_index]

    def groups(self, round_index: int) -> dict[bytes, RolloutGroup]:
        return self._rounds[round_index][1] if round_index in self._rounds else {}

    def wire(self, round_index: int, group_id: bytes) -> bytes | None:
        """The canonical encoding of a group we hold (None when we do not hold it)."""
        return self._wire.get(round_index, {}).get(group_id)

    def held_rounds(self) -> list[int]:
        return sorted(self._rounds)

    def request(self, requester: str, round_index: int, group_id: bytes) -> str:
        if round_index not in self._rounds:
            return UNOFFERED if round_index > self.current else NOT_HELD
        if group_id not in self._rounds[round_index][1]:
            return UNOFFERED
        return self.book.request(requester, group_id.hex(), round_index)

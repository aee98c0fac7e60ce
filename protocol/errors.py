"""The one error type the protocol raises for bad input, and the gossip verdicts it maps to.

Contract: decoding and validation raise `WireError` and nothing else for any input bytes. Its `verdict` says what
gossipsub should do with the message: REJECT for malformed or forged input (the forwarder is penalised), IGNORE
for input an honest but slow, newer or differently configured peer could send (dropped, not forwarded, no penalty).
"""

from __future__ import annotations

from enum import Enum


class Verdict(str, Enum):
    ACCEPT = "accept"
    REJECT = "reject"
    IGNORE = "ignore"


class WireError(Exception):
    """A message failed decoding or validation; `reason` is a stable code (see WIRE.md), `detail` is for humans."""

    def __init__(self, reason: str, verdict: Verdict = Verdict.REJECT, detail: str = "") -> None:
        super().__init__(f"{verdict.value}: {reason}" + (f": {detail}" if detail else ""))
        self.reason = reason
        self.verdict = verdict
        self.detail = detail


def reject(reason: str, detail: str = "") -> WireError:
    return WireError(reason, Verdict.REJECT, detail)


def ignore(reason: str, detail: str = "") -> WireError:
    return WireError(reason, Verdict.IGNORE, detail)

"""Telling a copycat from a coincidence: a sender's rate of groups that copy other peers' content.

Honest peers can produce the same group (the same task, greedy-ish completions): a duplicate alone costs nothing.
A copycat re-signs what it heard from others, so nearly everything it sends was first sent by someone else.
Contract: `CopyWatch(window, min_copies, fraction)`; `observe(sender, copied)` records one group of `sender` whose
content was not ours (`copied`: first received from another peer) and says whether the sender now copies at a rate
that marks a copycat: at least `min_copies` copies among its last `window` such groups, and at least `fraction` of
them. Only a copied group can mark it (its fresh groups never cost it anything). Pure, bounded: at most
`max_senders` senders are tracked (the least recently seen are forgotten).
"""

from __future__ import annotations

from collections import OrderedDict, deque

COPY_WINDOW = 32  # a sender's last groups (of content not ours) that its copying rate is measured over
COPY_MIN = 8  # copies in the window before the rate can mark a copycat
COPY_FRACTION = 0.5  # share of the window that must be copies
MAX_SENDERS = 4096


class CopyWatch:
    def __init__(self, window: int = COPY_WINDOW, min_copies: int = COPY_MIN, fraction: float = COPY_FRACTION,
                 max_senders: int = MAX_SENDERS) -> None:
        if window < 1 or not 1 <= min_copies <= window or not 0 < fraction <= 1 or max_senders < 1:
            raise ValueError("CopyWatch needs 1 <= min_copies <= window, 0 < fraction <= 1, max_senders >= 1")
        self.window = window
        self.min_copies = min_copies
        self.fraction = fraction
        self.max_senders = max_senders
        self._recent: OrderedDict[str, deque[bool]] = OrderedDict()

    def observe(self, sender: str, copied: bool) -> bool:
        recent = self._recent.pop(sender, None) or deque(maxlen=self.window)
        recent.append(copied)
        self._recent[sender] = recent
        while len(self._recent) > self.max_senders:
            self._recent.popitem(last=False)
        copies = sum(recent)
        return copied and copies >= self.min_copies and copies >= self.fraction * len(recent)

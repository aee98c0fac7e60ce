"""Messages the validator accepted, kept until their delivery so that a delivery is not decoded a second time.

Contract: `AcceptedMessages(capacity)`; `remember(data, msg)` after the validator decoded and accepted `data`;
`take(data)` returns that decoded message once (and forgets it), or None (never validated here, or evicted), in
which case the caller decodes `data` itself. Keyed by the exact bytes: the same bytes under the same limits decode
to the same message, so reusing the validator's result is exact. At most `capacity` entries (the oldest go first),
so messages the transport accepted but never delivered cannot grow it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from protocol.messages import Message

DEFAULT_CAPACITY = 256


class AcceptedMessages:
    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._messages: OrderedDict[bytes, Message] = OrderedDict()
        self._lock = threading.Lock()  # validators and deliveries may run on different threads (thread isolation)

    def __len__(self) -> int:
        return len(self._messages)

    def remember(self, data: bytes, msg: Message) -> None:
        with self._lock:
            self._messages[data] = msg
            self._messages.move_to_end(data)
            while len(self._messages) > self.capacity:
                self._messages.popitem(last=False)

    def take(self, data: bytes) -> Message | None:
        with self._lock:
            return self._messages.pop(data, None)

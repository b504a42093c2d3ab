"""taskpush.inventory: what a worker keeps across the loss of its dispatcher
(protocol version 3, proto/PROTOCOL.md).

Owns the outcomes kept until the dispatcher CONFIRMs them (Outcomes: in the order
they were made, bounded, the oldest dropped with a log record) and the HOLDING
frames that declare the deliveries still running. Not thread-safe: the Worker
calls it under its own lock.
"""
from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Iterable, List, Sequence

from . import proto


def outcome_limit(capacity: int) -> int:
    """How many unconfirmed outcomes a worker of this capacity keeps: a
    dispatcher that commits in batches leaves a few capacities' worth waiting,
    and 1024 more cover a failover's backlog."""
    return 4 * capacity + 1024


class Outcomes:
    """The DONEs sent (or to be sent) and not yet confirmed, by delivery."""

    def __init__(self, limit: int, log: logging.Logger) -> None:
        if limit < 1:
            raise ValueError("the outcome limit must be >= 1")
        self.limit = limit
        self.log = log
        self._kept: "OrderedDict[proto.Delivery, proto.Done]" = OrderedDict()
        self.evicted = 0  # dropped unconfirmed because the limit was reached

    def __len__(self) -> int:
        return len(self._kept)

    def keep(self, d: proto.Done) -> None:
        key = (d.task_id, d.epoch, d.attempt)
        self._kept[key] = d
        self._kept.move_to_end(key)
        while len(self._kept) > self.limit:
            (tid, epoch, attempt), _ = self._kept.popitem(last=False)
            self.evicted += 1
            # Only a failover before its commit makes this matter: then the
            # dispatcher recovers the row and the task runs again.
            self.log.warning("more than %d outcomes wait for CONFIRM; forgetting the oldest, "
                             "task %d (epoch %d, attempt %d)", self.limit, tid, epoch, attempt)

    def confirm(self, keys: Iterable[proto.Delivery]) -> int:
        """Forgets the confirmed ones; returns how many were kept."""
        n = 0
        for k in keys:
            if self._kept.pop(k, None) is not None:
                n += 1
        return n

    def pending(self) -> List[proto.Done]:
        """The kept outcomes, oldest first: what a new connection sends again."""
        return list(self._kept.values())

    def clear(self) -> int:
        n = len(self._kept)
        self._kept.clear()
        return n


def holding_frames(keys: Sequence[proto.Delivery]) -> List[proto.Holding]:
    """HOLDING frames declaring keys, at most MAX_CONFIRM per frame."""
    step = proto.MAX_CONFIRM
    return [proto.Holding(list(keys[i:i + step])) for i in range(0, len(keys), step)]

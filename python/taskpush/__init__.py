"""taskpush: a Python worker and producer library for taskpushd.

Speaks the wire protocol of proto/PROTOCOL.md (version 4, falling back to 3, 2 and 1)
with the standard library only. See python/README.md.
"""
from .proto import BadFrame, MAX_BODY_DEFAULT, PROTO_VERSION
from .session import (AuthRefused, ConnectError, NotLeader, TLSOptions, VersionRefused,
                      parse_addresses)
from .submit import (Client, NotSupported, Receipt, SubmitError, TaskOutcome, Unavailable,
                     make_task)
from .worker import Fail, PermanentFailure, RetryAfter, Task, Worker

__version__ = "0.1.0"

__all__ = [
    "AuthRefused", "BadFrame", "Client", "ConnectError", "Fail", "MAX_BODY_DEFAULT", "NotLeader",
    "NotSupported",
    "PROTO_VERSION", "PermanentFailure", "Receipt", "RetryAfter", "SubmitError", "TLSOptions", "Task",
    "TaskOutcome", "Unavailable", "VersionRefused", "Worker", "make_task", "parse_addresses",
    "submit",
]


def submit(addresses: str, type: str, payload: "bytes | str" = b"", priority: int = 1,
           dedup_key: "bytes | str | None" = None, delay_ms: int = 0, max_attempts: int = 0,
           timeout_ms: int = 0, wait: bool = False, token: "str | None" = None,
           tls: "bool | TLSOptions | None" = None, group_key: "bytes | str | None" = None) -> Receipt:
    """Submits one task on a connection of its own (tp_submit for a producer)."""
    with Client(addresses, token=token, tls=tls) as c:
        return c.submit(type, payload, priority, dedup_key, delay_ms, max_attempts, timeout_ms, wait,
                        group_key=group_key)

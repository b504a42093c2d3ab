package taskpush

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"taskpush.dev/taskpush/wire"
)

// Priority of a task. The zero value is normal, so that a NewTask left
// alone is; on the wire low, normal and high are 0, 1 and 2.
type Priority int8

const (
	PriorityLow    Priority = -1
	PriorityNormal Priority = 0
	PriorityHigh   Priority = 1
)

func (p Priority) wire() uint8 { return uint8(p + 1) }

func priorityFromWire(v uint8) Priority { return Priority(v) - 1 }

// Task is one delivery given to a handler. (ID, Epoch, Attempt) names it: a
// redelivery has a larger Attempt, a later dispatcher a larger Epoch.
type Task struct {
	ID       uint64
	Epoch    uint32
	Attempt  uint32
	Type     string
	Payload  []byte
	Priority Priority
	Lease    time.Duration // TASK timeout_ms: finish or Extend within it (0: none)

	w         *Worker
	origin    *conn // the connection that delivered it
	inventory bool  // version 3: it outlives its connection
	ctx       context.Context
	cancel    context.CancelFunc

	mu        sync.Mutex
	deadline  time.Time
	abandoned bool // forgotten by the worker: its outcome goes nowhere (under w.mu)
}

func (t *Task) key() wire.Delivery {
	return wire.Delivery{TaskID: t.ID, Epoch: t.Epoch, Attempt: t.Attempt}
}

// ErrTaskGone is returned by Extend once the delivery was cancelled (or, in
// protocol versions 1 and 2, its connection lost): give up then.
var ErrTaskGone = errors.New("taskpush: the delivery was cancelled")

// Extend asks the dispatcher to end the lease d from now (EXTEND). In protocol
// version 3, while no dispatcher is connected, nothing is sent and the answer
// is nil: the next dispatcher adopts the delivery.
func (t *Task) Extend(d time.Duration) error {
	ms := d.Milliseconds()
	if ms < 1 || ms > 0xFFFFFFFF {
		return fmt.Errorf("taskpush: extend by %v (1 ms to 2^32-1 ms)", d)
	}
	if t.ctx.Err() != nil {
		return ErrTaskGone
	}
	c := t.w.route(t)
	sent := c != nil && c.send(&wire.Extend{Delivery: t.key(), ExtendMs: uint32(ms)})
	if !sent && !t.inventory {
		return ErrTaskGone
	}
	t.mu.Lock()
	t.deadline = time.Now().Add(d)
	t.mu.Unlock()
	if sent {
		t.w.stats.add(&t.w.stats.ExtendsSent, 1)
	}
	return nil
}

// Remaining is the time before the lease ends, by this host's clock and the
// last Extend; a large value for a task without a lease.
func (t *Task) Remaining() time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.deadline.IsZero() {
		return time.Duration(1<<63 - 1)
	}
	return time.Until(t.deadline)
}

// Submit submits a new task on the worker's connection (protocol version 2 or
// later); see Client.Submit.
func (t *Task) Submit(ctx context.Context, nt NewTask) (Receipt, error) {
	return t.w.Submit(ctx, nt)
}

// PermanentError is a handler's error that fails the task for good: DONE
// FAIL_PERM, never retried. Make one with Permanent.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent marks err as a permanent failure.
func Permanent(err error) error {
	if err == nil {
		err = errors.New("permanent failure")
	}
	return &PermanentError{Err: err}
}

// RetryAfterError asks the dispatcher to deliver the task again after Delay
// (DONE RETRY_AFTER), while it has attempts left. Make one with RetryAfter.
type RetryAfterError struct {
	Delay time.Duration
	Err   error
}

func (e *RetryAfterError) Error() string { return e.Err.Error() }
func (e *RetryAfterError) Unwrap() error { return e.Err }

// RetryAfter asks for a retry after d (at most 2^32-1 ms).
func RetryAfter(d time.Duration, err error) error {
	if err == nil {
		err = errors.New("retry later")
	}
	return &RetryAfterError{Delay: d, Err: err}
}

// HandlerFunc runs one task. Its result is the task's result (SUCCESSFUL); an
// error fails the attempt (retried with the dispatcher's backoff while attempts
// are left), a Permanent error fails the task, a RetryAfter error retries it
// after a delay. ctx is cancelled when the dispatcher sends CANCEL (the lease
// expired, an operator cancelled it), or when the worker stops at once.
type HandlerFunc func(ctx context.Context, t *Task) ([]byte, error)

const maxErrorLen = 65535 // err_msg is a TEXT column

// doneFor is the DONE of an outcome made to fit the dispatcher's max_body: a
// result too large becomes a permanent failure saying so, an error text is cut
// at a UTF-8 boundary.
func doneFor(key wire.Delivery, outcome uint8, data []byte, delayMs uint32, maxBody uint32) *wire.Done {
	room := int(maxBody) - wire.DoneHead
	if room < 0 {
		room = 0
	}
	if outcome == wire.OutcomeSuccess && len(data) > room {
		outcome = wire.OutcomeFailPerm
		data = []byte(fmt.Sprintf("result of %d bytes exceeds the dispatcher's limit of %d", len(data), room))
	}
	if outcome != wire.OutcomeSuccess {
		limit := maxErrorLen
		if room < limit {
			limit = room
		}
		data = cutUTF8(data, limit)
	}
	return &wire.Done{Delivery: key, Outcome: outcome, RetryAfterMs: delayMs, Data: data}
}

func cutUTF8(b []byte, limit int) []byte {
	if len(b) <= limit {
		return b
	}
	end := limit
	for end > 0 && b[end]&0xC0 == 0x80 {
		end--
	}
	return b[:end]
}

// outcomeOf maps a handler's return to a DONE outcome.
func outcomeOf(result []byte, err error) (uint8, []byte, uint32) {
	if err == nil {
		return wire.OutcomeSuccess, result, 0
	}
	var ra *RetryAfterError
	if errors.As(err, &ra) {
		ms := ra.Delay.Milliseconds()
		if ms < 0 {
			ms = 0
		}
		if ms > 0xFFFFFFFF {
			ms = 0xFFFFFFFF
		}
		return wire.OutcomeRetryAfter, []byte(err.Error()), uint32(ms)
	}
	var pe *PermanentError
	if errors.As(err, &pe) {
		return wire.OutcomeFailPerm, []byte(err.Error()), 0
	}
	return wire.OutcomeFailRetry, []byte(err.Error()), 0
}

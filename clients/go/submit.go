package taskpush

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"taskpush.dev/taskpush/wire"
)

// NewTask is one task to submit.
type NewTask struct {
	Type        string
	Payload     []byte
	Priority    Priority      // PriorityNormal (the zero value), PriorityLow or PriorityHigh
	DedupKey    string        // at most 191 bytes; a second task with the key is a duplicate
	GroupKey    string        // fair share within a type and priority (at most 191 bytes)
	Delay       time.Duration // run no sooner than this after the insert
	Timeout     time.Duration // the lease; 0: the dispatcher's default
	MaxAttempts int           // 0: the table's default (3); at most 1000
}

// Receipt is one submitted task: its id, whether its DedupKey was already
// present (then TaskID is the existing row's, 0 if unknown), and with
// SubmitOptions.Wait its outcome (nil for a duplicate).
type Receipt struct {
	TaskID    uint64
	Duplicate bool
	Outcome   *TaskOutcome
}

// TaskOutcome is how a waited-for task ended.
type TaskOutcome struct {
	Succeeded bool   // SUCCESSFUL, else FAILED
	Data      []byte // the result, or the err_msg
}

// ErrUnavailable: nothing was committed (the dispatcher cannot reach the
// database or does not lead), or the connection was lost before the answer;
// safe to submit again (dedup keys make it idempotent).
var ErrUnavailable = errors.New("taskpush: unavailable")

// unavailableAnswer is a SUBMITTED UNAVAILABLE: nothing was committed, so the
// same submission may go to another address at once (a standby answers so).
type unavailableAnswer struct{ msg string }

func (e *unavailableAnswer) Error() string { return ErrUnavailable.Error() + ": " + e.msg }
func (e *unavailableAnswer) Unwrap() error { return ErrUnavailable }

// ErrNoSubmit: the session speaks protocol version 1, which has no SUBMIT.
var ErrNoSubmit = errors.New("taskpush: the dispatcher speaks protocol version 1: no SUBMIT")

// InvalidError: the dispatcher refused the submission (nothing was inserted).
type InvalidError struct{ Message string }

func (e *InvalidError) Error() string { return "taskpush: submit refused: " + e.Message }

func (nt *NewTask) entry() (wire.SubmitTask, error) {
	ms := func(d time.Duration) (uint32, error) {
		v := d.Milliseconds()
		if v < 0 || v > 0xFFFFFFFF {
			return 0, fmt.Errorf("taskpush: duration %v out of range", d)
		}
		return uint32(v), nil
	}
	delay, err := ms(nt.Delay)
	if err != nil {
		return wire.SubmitTask{}, err
	}
	timeout, err := ms(nt.Timeout)
	if err != nil {
		return wire.SubmitTask{}, err
	}
	if nt.MaxAttempts < 0 || nt.MaxAttempts > wire.MaxAttempts || nt.Priority < PriorityLow || nt.Priority > PriorityHigh {
		return wire.SubmitTask{}, fmt.Errorf("taskpush: max attempts %d, priority %d", nt.MaxAttempts, nt.Priority)
	}
	return wire.SubmitTask{Priority: nt.Priority.wire(), MaxAttempts: uint16(nt.MaxAttempts),
		DelayMs: delay, TimeoutMs: timeout, TaskType: []byte(nt.Type), DedupKey: []byte(nt.DedupKey),
		Payload: nt.Payload, GroupKey: []byte(nt.GroupKey)}, nil
}

// pendingSubmit waits for one SUBMITTED and, with WAIT, an OUTCOME per
// inserted task. The channel has room for all of them, so the reader never
// blocks; extra frames from a confused peer are dropped.
type pendingSubmit struct {
	ch chan wire.Message
}

// submitter tracks the request ids of one session.
type submitter struct {
	mu      sync.Mutex
	next    uint32
	pending map[uint32]*pendingSubmit
}

func newSubmitter() *submitter {
	return &submitter{next: 1, pending: make(map[uint32]*pendingSubmit)}
}

// onFrame takes SUBMITTED and OUTCOME; false for any other frame.
func (s *submitter) onFrame(m wire.Message) bool {
	var id uint32
	switch v := m.(type) {
	case *wire.Submitted:
		id = v.RequestID
	case *wire.Outcome:
		id = v.RequestID
	default:
		return false
	}
	s.mu.Lock()
	p := s.pending[id]
	s.mu.Unlock()
	if p != nil {
		select {
		case p.ch <- m:
		default:
		}
	}
	return true
}

func (s *submitter) submit(ctx context.Context, c *conn, tasks []NewTask, wait bool) ([]Receipt, error) {
	if c == nil || c.isClosed() {
		return nil, fmt.Errorf("%w: not connected to a dispatcher", ErrUnavailable)
	}
	if c.version < 2 {
		return nil, ErrNoSubmit
	}
	if len(tasks) == 0 || len(tasks) > wire.MaxSubmitTasks {
		return nil, fmt.Errorf("taskpush: 1 to %d tasks per submit", wire.MaxSubmitTasks)
	}
	msg := &wire.Submit{Tasks: make([]wire.SubmitTask, len(tasks))}
	for i := range tasks {
		e, err := tasks[i].entry()
		if err != nil {
			return nil, err
		}
		if len(e.GroupKey) > 0 {
			// Without a key the frame is the one every dispatcher takes.
			msg.Flags |= wire.SubmitGroupKey
		}
		msg.Tasks[i] = e
	}
	if wait {
		msg.Flags |= wire.SubmitWait
	}
	p := &pendingSubmit{ch: make(chan wire.Message, len(tasks)+1)}
	s.mu.Lock()
	msg.RequestID = s.next
	s.next = s.next%0xFFFFFFFF + 1
	s.pending[msg.RequestID] = p
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.pending, msg.RequestID)
		s.mu.Unlock()
	}()
	frame, err := wire.Encode(msg)
	if err != nil {
		return nil, fmt.Errorf("taskpush: %w", err)
	}
	if len(frame)-wire.LenPrefix > int(c.maxBody) {
		return nil, fmt.Errorf("taskpush: the submit exceeds the dispatcher's %d-byte frame limit", c.maxBody)
	}
	if !c.send(msg) {
		return nil, fmt.Errorf("%w: the connection was lost before the submit was sent", ErrUnavailable)
	}
	next := func(acked bool) (wire.Message, error) {
		select {
		case m := <-p.ch:
			return m, nil
		case <-c.done:
			if acked {
				return nil, fmt.Errorf("%w: the connection was lost (the submit was acknowledged; "+
					"its outcome is in the table)", ErrUnavailable)
			}
			return nil, fmt.Errorf("%w: the connection was lost before the answer", ErrUnavailable)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	var ans *wire.Submitted
	for ans == nil {
		m, err := next(false)
		if err != nil {
			return nil, err
		}
		ans, _ = m.(*wire.Submitted)
	}
	switch ans.Status {
	case wire.StatusInvalid:
		return nil, &InvalidError{Message: string(ans.Message)}
	case wire.StatusUnavailable:
		return nil, &unavailableAnswer{msg: string(ans.Message)}
	}
	if len(ans.Results) != len(tasks) {
		return nil, fmt.Errorf("taskpush: SUBMITTED has %d results for %d tasks", len(ans.Results), len(tasks))
	}
	receipts := make([]Receipt, len(tasks))
	waiting := make(map[uint64]int)
	for i, r := range ans.Results {
		receipts[i] = Receipt{TaskID: r.TaskID, Duplicate: r.Result == wire.ResultDuplicate}
		if wait && !receipts[i].Duplicate {
			waiting[r.TaskID] = i
		}
	}
	for len(waiting) > 0 {
		m, err := next(true)
		if err != nil {
			return receipts, err
		}
		o, ok := m.(*wire.Outcome)
		if !ok {
			continue
		}
		if i, ok := waiting[o.TaskID]; ok {
			receipts[i].Outcome = &TaskOutcome{Succeeded: o.State == wire.StateSuccessful, Data: o.Data}
			delete(waiting, o.TaskID)
		}
	}
	return receipts, nil
}

// Client is a producer-only connection: it submits tasks and takes none. It
// connects on the first Submit (the addresses tried in turn) and again after
// the connection is lost. Safe for concurrent use.
type Client struct {
	addrs []string
	opts  Options

	mu       sync.Mutex
	cur      *conn
	curIdx   int // the address of cur; the next dial starts there
	sub      *submitter
	versions map[string]int
	closed   bool
	serving  sync.WaitGroup
}

// NewClient makes a Client for "HOST:PORT[,HOST:PORT...]".
func NewClient(addresses string, opts Options) (*Client, error) {
	addrs, err := ParseAddresses(addresses)
	if err != nil {
		return nil, err
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if o.ProtocolVersion < 2 {
		return nil, ErrNoSubmit
	}
	return &Client{addrs: addrs, opts: o, versions: make(map[string]int)}, nil
}

func (cl *Client) connected(ctx context.Context) (*conn, *submitter, error) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.closed {
		return nil, nil, fmt.Errorf("%w: the client is closed", ErrUnavailable)
	}
	if cl.cur != nil && !cl.cur.isClosed() {
		return cl.cur, cl.sub, nil
	}
	hello := &wire.Hello{Name: []byte(cl.opts.Name), Token: []byte(cl.opts.Token)}
	var errs []string
	for i := range cl.addrs {
		idx := (cl.curIdx + i) % len(cl.addrs)
		a := cl.addrs[idx]
		c, err := dialNegotiated(ctx, a, hello, cl.versions, cl.opts.ProtocolVersion, 2, &cl.opts)
		if err != nil {
			if errors.Is(err, ErrVersion) {
				return nil, nil, fmt.Errorf("%w (%v)", ErrNoSubmit, err)
			}
			errs = append(errs, err.Error())
			continue
		}
		cl.opts.Logf("producer connected to %s", a)
		sub := newSubmitter()
		cl.cur, cl.sub, cl.curIdx = c, sub, idx
		cl.serving.Add(1)
		go func() {
			defer cl.serving.Done()
			reason := c.serve(func(m wire.Message) error {
				switch m.(type) {
				case *wire.Heartbeat, *wire.Stop:
					return nil
				}
				if !sub.onFrame(m) {
					return fmt.Errorf("unexpected %s on a producer connection", m.Type())
				}
				return nil
			})
			cl.opts.Logf("producer connection to %s ended: %v", a, reason)
		}()
		return c, sub, nil
	}
	return nil, nil, fmt.Errorf("%w: no dispatcher reachable: %v", ErrUnavailable, errs)
}

// Submit inserts tasks in one SUBMIT (1 to 1000) and returns once their rows
// are committed: a receipt per task, in order. A dispatcher that answers
// UNAVAILABLE (a standby, or one without its database) committed nothing: the
// submission goes to the next address at once, each address tried once. An
// error wrapping ErrUnavailable means nothing was acknowledged: submit again
// (with dedup keys to be safe); an *InvalidError that nothing was inserted.
func (cl *Client) Submit(ctx context.Context, tasks ...NewTask) ([]Receipt, error) {
	return cl.submit(ctx, tasks, false)
}

// SubmitWait is Submit that also waits for each inserted task to end
// (SUCCESSFUL, or FAILED after its last attempt): Receipt.Outcome.
func (cl *Client) SubmitWait(ctx context.Context, tasks ...NewTask) ([]Receipt, error) {
	return cl.submit(ctx, tasks, true)
}

func (cl *Client) submit(ctx context.Context, tasks []NewTask, wait bool) ([]Receipt, error) {
	var err error
	for range cl.addrs {
		var c *conn
		var sub *submitter
		if c, sub, err = cl.connected(ctx); err != nil {
			return nil, err
		}
		var rs []Receipt
		rs, err = sub.submit(ctx, c, tasks, wait)
		var ua *unavailableAnswer
		if !errors.As(err, &ua) || len(cl.addrs) == 1 {
			return rs, err
		}
		cl.opts.Logf("%s answered UNAVAILABLE (%s); trying the next address", c.addr, ua.msg)
		cl.mu.Lock()
		if cl.cur == c {
			cl.cur = nil
			cl.curIdx = (cl.curIdx + 1) % len(cl.addrs)
		}
		cl.mu.Unlock()
		c.closeAfterFlush()
	}
	return nil, err
}

// Close closes the connection after what is queued is written.
func (cl *Client) Close() error {
	cl.mu.Lock()
	cl.closed = true
	c := cl.cur
	cl.mu.Unlock()
	if c != nil {
		c.closeAfterFlush()
	}
	cl.serving.Wait()
	return nil
}

// dialNegotiated dials from versions[addr] (or first) down to lowest: a
// dispatcher that answers ERROR VERSION is asked again one version lower, and
// versions remembers what it speaks.
func dialNegotiated(ctx context.Context, addr string, hello *wire.Hello, versions map[string]int,
	first, lowest int, o *Options) (*conn, error) {
	v, ok := versions[addr]
	if !ok {
		v = first
	}
	for {
		h := *hello
		h.Version = uint16(v)
		c, err := dial(ctx, addr, &h, o.TLS, o.ConnectTimeout)
		if err == nil || !errors.Is(err, ErrVersion) || v <= lowest {
			return c, err
		}
		v--
		versions[addr] = v
		o.Logf("%s refused protocol version %d; falling back to %d", addr, v+1, v)
	}
}

package taskpush

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"sync"
	"sync/atomic"
	"time"

	"taskpush.dev/taskpush/wire"
)

const (
	// The pause before the next address of a round (this to twice this), and
	// the cap of the backoff's exponent after a round that met a standby, as
	// libtaskpush.
	nextHostPause   = 20 * time.Millisecond
	notLeaderMaxExp = 3
	maxCapacity     = 65536
)

// Stats counts what a Worker did; Worker.Stats returns a copy.
type Stats struct {
	ConnectAttempts    int64
	Connections        int64
	Disconnects        int64
	TasksReceived      int64
	TasksCompleted     int64 // outcomes made and sent (or kept for the next connection)
	TasksDropped       int64 // abandoned: their outcomes went nowhere
	CancelsReceived    int64
	ExtendsSent        int64
	DeliveriesDeclared int64 // HOLDING entries sent after a reconnect
	OutcomesResent     int64
	OutcomesConfirmed  int64
	OutcomesForgotten  int64 // unconfirmed outcomes dropped past the limit
}

func (s *Stats) add(field *int64, n int64) { atomic.AddInt64(field, n) }

type slot struct {
	name        string
	fn          HandlerFunc
	concurrency int
	queue       chan *Task
}

// Worker takes tasks of its registered types from a dispatcher and runs their
// handlers, each type on as many goroutines as its concurrency; the HELLO's
// capacity (the dispatcher's credit) is the sum.
//
// In a protocol version 3 session the worker keeps running what it holds when
// the dispatcher goes away, keeps every outcome until a dispatcher CONFIRMs
// it, and on the next connection declares the deliveries still running
// (HOLDING) and sends the unconfirmed outcomes again.
type Worker struct {
	addrs []string
	opts  Options
	slots map[string]*slot
	order []string

	mu       sync.Mutex
	held     map[wire.Delivery]*Task
	kept     *outcomes
	cur      *conn
	sub      *submitter
	running  bool
	ran      bool // a Worker runs once
	capacity int

	kick       chan struct{} // something the session loop waits for changed
	abortCh    chan struct{}
	abortOnce  sync.Once
	hardCtx    context.Context // parent of every task's context: Abort cancels it
	hardCancel context.CancelFunc
	stats      Stats
}

// NewWorker makes a worker for "HOST:PORT[,HOST:PORT...]": a leader and its
// standbys, tried in turn.
func NewWorker(addresses string, opts Options) (*Worker, error) {
	addrs, err := ParseAddresses(addresses)
	if err != nil {
		return nil, err
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Worker{addrs: addrs, opts: o, slots: make(map[string]*slot),
		held: make(map[wire.Delivery]*Task), kept: newOutcomes(outcomeLimit(0)),
		kick: make(chan struct{}, 1), abortCh: make(chan struct{}), hardCtx: ctx, hardCancel: cancel}, nil
}

// Handle registers the handler of one task type, run on concurrency goroutines.
func (w *Worker) Handle(taskType string, concurrency int, fn HandlerFunc) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.running:
		return errors.New("taskpush: register handlers before Run")
	case len(taskType) < 1 || len(taskType) > wire.MaxTypeLen:
		return fmt.Errorf("taskpush: a task type of 1 to %d bytes", wire.MaxTypeLen)
	case w.slots[taskType] != nil:
		return fmt.Errorf("taskpush: a handler for %q is already registered", taskType)
	case len(w.slots) >= wire.MaxTypes:
		return fmt.Errorf("taskpush: at most %d task types", wire.MaxTypes)
	case concurrency < 1 || w.capacity+concurrency > maxCapacity:
		return fmt.Errorf("taskpush: concurrency >= 1, and at most %d in all", maxCapacity)
	case fn == nil:
		return errors.New("taskpush: a nil handler")
	}
	w.slots[taskType] = &slot{name: taskType, fn: fn, concurrency: concurrency}
	w.order = append(w.order, taskType)
	w.capacity += concurrency
	return nil
}

// Stats returns a copy of the worker's counters.
func (w *Worker) Stats() Stats {
	s := &w.stats
	return Stats{atomic.LoadInt64(&s.ConnectAttempts), atomic.LoadInt64(&s.Connections),
		atomic.LoadInt64(&s.Disconnects), atomic.LoadInt64(&s.TasksReceived),
		atomic.LoadInt64(&s.TasksCompleted), atomic.LoadInt64(&s.TasksDropped),
		atomic.LoadInt64(&s.CancelsReceived), atomic.LoadInt64(&s.ExtendsSent),
		atomic.LoadInt64(&s.DeliveriesDeclared), atomic.LoadInt64(&s.OutcomesResent),
		atomic.LoadInt64(&s.OutcomesConfirmed), atomic.LoadInt64(&s.OutcomesForgotten)}
}

// Held is the number of deliveries received and not yet answered.
func (w *Worker) Held() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.held)
}

// Unconfirmed is the number of outcomes kept until a dispatcher confirms them.
func (w *Worker) Unconfirmed() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.kept.len()
}

// ConnectedVersion is the protocol version of the current session, 0 when
// not connected.
func (w *Worker) ConnectedVersion() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cur == nil || w.cur.isClosed() {
		return 0
	}
	return w.cur.version
}

// Abort stops at once: the connection closes, every held task's context is
// cancelled and its outcome dropped (the dispatcher delivers it again). Run
// returns once the handlers have returned. Safe from any goroutine.
func (w *Worker) Abort() {
	w.abortOnce.Do(func() {
		close(w.abortCh)
		// Forgotten before their contexts end, so that a handler returning now
		// makes no outcome.
		w.abandon(func(*Task) bool { return true })
		w.hardCancel()
		w.mu.Lock()
		c := w.cur
		w.mu.Unlock()
		if c != nil {
			c.abort()
		}
		w.poke()
	})
}

func (w *Worker) aborted() bool {
	select {
	case <-w.abortCh:
		return true
	default:
		return false
	}
}

func (w *Worker) poke() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// Submit submits one task on the worker's current connection (protocol
// version 2 or later) and returns once its row is committed; ErrUnavailable
// when not connected.
func (w *Worker) Submit(ctx context.Context, nt NewTask) (Receipt, error) {
	w.mu.Lock()
	c, sub := w.cur, w.sub
	w.mu.Unlock()
	if sub == nil {
		return Receipt{}, fmt.Errorf("%w: not connected to a dispatcher", ErrUnavailable)
	}
	r, err := sub.submit(ctx, c, []NewTask{nt}, false)
	if err != nil {
		return Receipt{}, err
	}
	return r[0], nil
}

// Run connects and takes tasks, reconnecting with backoff, until ctx is
// cancelled; then it drains: STOP to the dispatcher, which sends no more; the
// held tasks finish (their contexts are not cancelled), their outcomes are
// sent and, in version 3, confirmed (up to 10 heartbeats, at least 2 s); the
// connection closes and Run returns nil once every handler has returned.
// Options.DrainTimeout bounds the drain; Abort cuts it short. A Worker runs
// once.
func (w *Worker) Run(ctx context.Context) error {
	w.mu.Lock()
	if w.running || w.ran {
		w.mu.Unlock()
		return errors.New("taskpush: a Worker runs once; make a new one")
	}
	if len(w.slots) == 0 {
		w.mu.Unlock()
		return errors.New("taskpush: register a handler first")
	}
	w.running, w.ran = true, true
	w.kept = newOutcomes(outcomeLimit(w.capacity))
	w.mu.Unlock()

	var pool sync.WaitGroup
	for _, name := range w.order {
		s := w.slots[name]
		// Room for every delivery the dispatcher may send, and for the ones a new
		// dispatcher refused to adopt that still run: the reader never blocks.
		s.queue = make(chan *Task, 2*w.capacity+16)
		for i := 0; i < s.concurrency; i++ {
			pool.Add(1)
			go func(s *slot) {
				defer pool.Done()
				w.handlerLoop(s)
			}(s)
		}
	}
	runDone := make(chan struct{})
	defer close(runDone)
	go func() {
		select {
		case <-ctx.Done():
		case <-runDone:
			return
		}
		if w.opts.DrainTimeout > 0 {
			t := time.NewTimer(w.opts.DrainTimeout)
			defer t.Stop()
			select {
			case <-t.C:
				w.opts.Logf("the drain took longer than %v; stopping at once", w.opts.DrainTimeout)
				w.Abort()
			case <-runDone:
			}
		}
	}()

	w.connectLoop(ctx)
	// Stopped while no dispatcher was connected: the running tasks still finish.
	tick := time.NewTicker(50 * time.Millisecond)
	for w.Held() > 0 && !w.aborted() {
		select {
		case <-w.kick:
		case <-tick.C:
		case <-w.abortCh:
		}
	}
	tick.Stop()
	if w.aborted() {
		w.abandon(func(*Task) bool { return true })
	}
	for _, s := range w.slots {
		close(s.queue)
	}
	pool.Wait()
	w.hardCancel()
	w.mu.Lock()
	w.running = false
	w.mu.Unlock()
	w.opts.Logf("worker %s stopped", w.opts.Name)
	return nil
}

func sleepCtx(ctx context.Context, abort <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return false
	case <-ctx.Done():
		return true
	case <-abort:
		return true
	}
}

// connectLoop is libtaskpush's: a host that fails or does not lead
// (NOT_LEADER) is left for the next after a short pause; the backoff comes
// once all failed in a row.
func (w *Worker) connectLoop(ctx context.Context) {
	bo := &backoff{min: w.opts.ReconnectMin, max: w.opts.ReconnectMax}
	versions := make(map[string]int)
	n := len(w.addrs)
	idx, misses, standby := 0, 0, false
	hello := &wire.Hello{Capacity: uint32(w.capacity), Name: []byte(w.opts.Name), Token: []byte(w.opts.Token)}
	for _, t := range w.order {
		hello.Types = append(hello.Types, []byte(t))
	}
	for ctx.Err() == nil && !w.aborted() {
		addr := w.addrs[idx%n]
		w.stats.add(&w.stats.ConnectAttempts, 1)
		c, err := dialNegotiated(ctx, addr, hello, versions, w.opts.ProtocolVersion, wire.VersionMin, &w.opts)
		notLeader := errors.Is(err, ErrNotLeader)
		standby = standby || notLeader
		switch {
		case err == nil:
		case errors.Is(err, ErrAuth):
			w.opts.Logf("ERROR %v", err)
		default:
			w.opts.Logf("cannot connect to %s: %v", addr, err)
		}
		if c != nil {
			misses, standby = 0, false
			bo.reset()
			w.stats.add(&w.stats.Connections, 1)
			w.opts.Logf("connected to %s (protocol %d, heartbeat %v, %s)", addr, c.version, c.hb, c.server)
			reason := w.serve(ctx, c)
			w.opts.Logf("connection to %s ended: %v", addr, reason)
			if ctx.Err() != nil || w.aborted() {
				return
			}
			standby = errors.Is(reason, ErrNotLeader)
			if n == 1 {
				// The same address after a short delay: a restarted dispatcher is
				// found again quickly.
				if sleepCtx(ctx, w.abortCh, bo.next()) {
					return
				}
				continue
			}
		}
		if notLeader || (c != nil && standby) {
			w.opts.Logf("%s does not lead; trying %s", addr, w.addrs[(idx+1)%n])
		}
		idx++
		misses++
		var delay time.Duration
		if misses < n {
			delay = nextHostPause + time.Duration(rand.Int63n(int64(nextHostPause)))
		} else {
			if standby {
				bo.capAt(notLeaderMaxExp)
			}
			delay = bo.next()
			misses, standby = 0, false
		}
		if sleepCtx(ctx, w.abortCh, delay) {
			return
		}
	}
}

// serve runs one session: frames in, the drain when ctx ends, until the
// connection closes.
func (w *Worker) serve(ctx context.Context, c *conn) error {
	sub := newSubmitter()
	w.takeOver(c, sub)
	var peerStop atomic.Bool
	served := make(chan error, 1)
	go func() {
		served <- c.serve(func(m wire.Message) error { return w.onFrame(c, sub, &peerStop, m) })
	}()
	defer func() {
		w.mu.Lock()
		if w.cur == c {
			w.cur, w.sub = nil, nil
		}
		w.mu.Unlock()
		w.stats.add(&w.stats.Disconnects, 1)
		// Version 3 deliveries outlive the connection; older ones go back to the
		// dispatcher.
		atOnce := w.aborted()
		w.abandon(func(t *Task) bool { return atOnce || (!t.inventory && t.origin == c) })
		if n := w.Held(); n > 0 {
			w.opts.Logf("%d deliveries keep running; they are declared to the next dispatcher", n)
		}
	}()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	ctxDone, abortCh := ctx.Done(), w.abortCh
	var settleBy time.Time
	closing := false
	for {
		select {
		case reason := <-served:
			return reason
		case <-ctxDone:
			ctxDone = nil
			c.send(&wire.Stop{})
		case <-w.kick:
		case <-tick.C:
		case <-abortCh:
			abortCh = nil
			c.abort()
		}
		if !closing && peerStop.Load() && w.Held() == 0 && !w.settling(c, &settleBy) {
			closing = true
			c.closeAfterFlush()
		}
	}
}

// settling: a closing version 3 session waits for CONFIRMs (up to 10
// heartbeats, at least 2 s): a confirmed outcome is one a failover cannot lose.
func (w *Worker) settling(c *conn, by *time.Time) bool {
	n := w.Unconfirmed()
	if c.version < 3 || n == 0 {
		return false
	}
	if by.IsZero() {
		wait := 10 * c.hb
		if wait < 2*time.Second {
			wait = 2 * time.Second
		}
		*by = time.Now().Add(wait)
	}
	if time.Now().Before(*by) {
		return true
	}
	w.opts.Logf("closing with %d outcomes unconfirmed; the next connection sends them again", n)
	return false
}

// takeOver makes c the current session. In version 3 it first declares the
// deliveries held from earlier connections and not cancelled (HOLDING) and
// sends again the outcomes not yet confirmed, queued before any other frame;
// an older version cannot take them, so they are abandoned.
func (w *Worker) takeOver(c *conn, sub *submitter) {
	var gone []*Task
	w.mu.Lock()
	w.cur, w.sub = c, sub
	var keys []wire.Delivery
	for k, t := range w.held {
		if t.ctx.Err() == nil {
			keys = append(keys, k)
		}
	}
	pending := w.kept.pending()
	if c.version >= 3 {
		for _, h := range holdingFrames(keys) {
			c.send(h)
		}
		for _, d := range pending {
			c.send(doneFor(d.Delivery, d.Outcome, d.Data, d.RetryAfterMs, c.maxBody))
		}
		w.stats.add(&w.stats.DeliveriesDeclared, int64(len(keys)))
		w.stats.add(&w.stats.OutcomesResent, int64(len(pending)))
	} else {
		gone = w.abandonLocked(func(*Task) bool { return true })
		w.kept.clear()
	}
	w.mu.Unlock()
	for _, t := range gone {
		t.cancel()
	}
	if len(keys)+len(pending) > 0 {
		if c.version >= 3 {
			w.opts.Logf("%s: declared %d running deliveries, sent %d unconfirmed outcomes again",
				c.addr, len(keys), len(pending))
		} else {
			w.opts.Logf("%s speaks protocol version %d, which cannot adopt deliveries: %d running and "+
				"%d finished ones are abandoned", c.addr, c.version, len(keys), len(pending))
		}
	}
}

func (w *Worker) onFrame(c *conn, sub *submitter, peerStop *atomic.Bool, m wire.Message) error {
	switch v := m.(type) {
	case *wire.Task:
		w.onTask(c, v)
	case *wire.Cancel:
		w.mu.Lock()
		t := w.held[v.Delivery]
		w.mu.Unlock()
		if t != nil {
			w.stats.add(&w.stats.CancelsReceived, 1)
			w.opts.Logf("task %d (attempt %d) cancelled by the dispatcher", t.ID, t.Attempt)
			t.cancel()
		}
	case *wire.Confirm:
		if c.version < 3 {
			return errors.New("unexpected CONFIRM in a session before version 3")
		}
		w.mu.Lock()
		n := w.kept.confirm(v.Deliveries)
		w.mu.Unlock()
		w.stats.add(&w.stats.OutcomesConfirmed, int64(n))
		w.poke()
	case *wire.Stop:
		peerStop.Store(true)
		w.poke()
	case *wire.Heartbeat:
	default:
		if !sub.onFrame(m) {
			return fmt.Errorf("unexpected %s from the dispatcher", m.Type())
		}
	}
	return nil
}

func (w *Worker) onTask(c *conn, v *wire.Task) {
	w.stats.add(&w.stats.TasksReceived, 1)
	t := &Task{ID: v.TaskID, Epoch: v.Epoch, Attempt: v.Attempt, Type: string(v.TaskType),
		Payload: v.Payload, Priority: priorityFromWire(v.Priority),
		Lease: time.Duration(v.TimeoutMs) * time.Millisecond,
		w:     w, origin: c, inventory: c.version >= 3}
	t.ctx, t.cancel = context.WithCancel(w.hardCtx)
	if t.Lease > 0 {
		t.deadline = time.Now().Add(t.Lease)
	}
	w.mu.Lock()
	w.held[t.key()] = t
	w.mu.Unlock()
	s := w.slots[t.Type]
	if s == nil { // the dispatcher sends only registered types; answer anyway
		w.finish(t, wire.OutcomeFailPerm, []byte("no handler for this task type"), 0)
		return
	}
	select {
	case s.queue <- t:
	default: // more than the credit allows: never block the reader
		w.finish(t, wire.OutcomeFailRetry, []byte("the dispatcher sent more tasks than the worker's capacity"), 0)
	}
}

func (w *Worker) handlerLoop(s *slot) {
	for t := range s.queue {
		w.mu.Lock()
		gone := t.abandoned
		w.mu.Unlock()
		// Abandoned, or a version 1/2 delivery whose connection is gone (the
		// dispatcher delivers it again): not run.
		if gone || (!t.inventory && t.origin.isClosed()) {
			w.drop(t)
			continue
		}
		res, err := w.call(s, t)
		outcome, data, delay := outcomeOf(res, err)
		w.finish(t, outcome, data, delay)
	}
}

func (w *Worker) call(s *slot, t *Task) (res []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
			w.opts.Logf("handler of %s panicked on task %d: %v", s.name, t.ID, r)
		}
	}()
	return s.fn(t.ctx, t)
}

func (w *Worker) finish(t *Task, outcome uint8, data []byte, delayMs uint32) {
	defer w.poke() // a draining session looks at Held again
	d := doneFor(t.key(), outcome, data, delayMs, t.origin.maxBody)
	if !t.inventory {
		sent := t.origin.send(d)
		w.mu.Lock()
		delete(w.held, t.key())
		w.mu.Unlock()
		t.cancel()
		if sent {
			w.stats.add(&w.stats.TasksCompleted, 1)
		} else {
			w.stats.add(&w.stats.TasksDropped, 1)
		}
		return
	}
	// Version 3: kept until confirmed. Keeping it and reading the current
	// session under one lock means either takeOver sends it again or the
	// session read here had its HOLDING queued already.
	w.mu.Lock()
	delete(w.held, t.key())
	if t.abandoned {
		w.mu.Unlock()
		w.stats.add(&w.stats.TasksDropped, 1)
		return
	}
	old := w.kept.keep(d)
	c := w.cur
	w.mu.Unlock()
	t.cancel()
	w.stats.add(&w.stats.TasksCompleted, 1)
	if old != nil {
		w.stats.add(&w.stats.OutcomesForgotten, 1)
		w.opts.Logf("more than %d outcomes wait for CONFIRM; forgetting the oldest, task %d (epoch %d, attempt %d)",
			w.kept.limit, old.TaskID, old.Epoch, old.Attempt)
	}
	if c != nil && c.version >= 3 {
		c.send(doneFor(d.Delivery, d.Outcome, d.Data, d.RetryAfterMs, c.maxBody))
	}
}

func (w *Worker) drop(t *Task) {
	w.mu.Lock()
	delete(w.held, t.key())
	w.mu.Unlock()
	t.cancel()
	w.stats.add(&w.stats.TasksDropped, 1)
	w.poke()
}

// abandon forgets the held deliveries which selects: their contexts are
// cancelled and their outcomes dropped. Stopping at once, the kept outcomes go
// too.
func (w *Worker) abandon(which func(*Task) bool) {
	w.mu.Lock()
	gone := w.abandonLocked(which)
	if w.aborted() {
		w.kept.clear()
	}
	w.mu.Unlock()
	for _, t := range gone {
		t.cancel()
	}
}

func (w *Worker) abandonLocked(which func(*Task) bool) []*Task {
	var gone []*Task
	for k, t := range w.held {
		if which(t) {
			t.abandoned = true
			delete(w.held, k)
			gone = append(gone, t)
		}
	}
	return gone
}

// route is the session a frame about t goes on: its own in versions 1 and 2;
// in version 3 the current one, nil between connections.
func (w *Worker) route(t *Task) *conn {
	if !t.inventory {
		return t.origin
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cur != nil && w.cur.version >= 3 {
		return w.cur
	}
	return nil
}

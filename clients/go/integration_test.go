package taskpush_test

// The Go worker and client against the real taskpushd and MariaDB over TCP:
// the scenarios of tests/conformance/README.md that the Go client runs so far.
// Waits are bounded polls; nothing asserts how long something took.

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"taskpush.dev/taskpush"
)

// logBuffer keeps the library's diagnostics, printed when a test fails.
type logBuffer struct {
	mu    sync.Mutex
	lines []string
}

func (l *logBuffer) logf(format string, args ...interface{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, time.Now().Format("15:04:05.000 ")+fmt.Sprintf(format, args...))
}

func (l *logBuffer) text() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

func (l *logBuffer) has(s string) bool { return strings.Contains(l.text(), s) }

type running struct {
	w    *taskpush.Worker
	stop context.CancelFunc
	done chan error
	log  *logBuffer
}

func newWorker(t *testing.T, addrs string, opts taskpush.Options) (*taskpush.Worker, *logBuffer) {
	t.Helper()
	lb := &logBuffer{}
	if opts.ReconnectMin == 0 {
		opts.ReconnectMin, opts.ReconnectMax = 50*time.Millisecond, 200*time.Millisecond
	}
	opts.Name = t.Name()
	opts.Logf = lb.logf
	w, err := taskpush.NewWorker(addrs, opts)
	if err != nil {
		t.Fatal(err)
	}
	return w, lb
}

func start(t *testing.T, w *taskpush.Worker, lb *logBuffer) *running {
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{w: w, stop: cancel, done: make(chan error, 1), log: lb}
	go func() { r.done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		w.Abort()
		select {
		case <-r.done:
		case <-time.After(waitBound):
			t.Errorf("the worker did not stop within %v", waitBound)
		}
		if t.Failed() {
			t.Logf("---- worker log ----\n%s", lb.text())
		}
	})
	return r
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// Every task runs once, and the handler sees the row's delivery.
func TestDrainExactlyOnce(t *testing.T) {
	needIntegration(t)
	t.Parallel()
	db := newDB(t)
	d := startDaemon(t, db, "127.0.0.1:0", true)
	const n = 300
	payloads := make([]string, n)
	for i := range payloads {
		payloads[i] = fmt.Sprintf("p%d", i)
	}
	db.insert("noop", payloads...)
	var mu sync.Mutex
	runs := map[uint64]int{}
	var bad []string
	w, lb := newWorker(t, d.listen, taskpush.Options{})
	must(t, w.Handle("noop", 16, func(ctx context.Context, task *taskpush.Task) ([]byte, error) {
		mu.Lock()
		runs[task.ID]++
		if task.Attempt != 1 || task.Epoch == 0 || task.Priority != taskpush.PriorityNormal || task.Type != "noop" {
			bad = append(bad, fmt.Sprintf("%+v", task))
		}
		mu.Unlock()
		return append([]byte("r-"), task.Payload...), nil
	}))
	start(t, w, lb)
	db.waitRows(t, "task_state = 2", n)
	if got := db.count("task_state = 2 AND attempts = 1 AND result = CONCAT('r-', payload)"); got != n {
		t.Fatalf("%d rows SUCCESSFUL at attempt 1 with the handler's result, want %d", got, n)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(runs) != n || len(bad) != 0 {
		t.Fatalf("%d ids ran, want %d; deliveries not as the rows: %v", len(runs), n, bad)
	}
	for id, c := range runs {
		if c != 1 {
			t.Fatalf("task %d ran %d times", id, c)
		}
	}
}

// Every outcome a handler can give, as the dispatcher writes it.
func TestOutcomes(t *testing.T) {
	needIntegration(t)
	t.Parallel()
	db := newDB(t)
	d := startDaemon(t, db, "127.0.0.1:0", true)
	db.insert("perm", "x")
	db.exec("INSERT INTO task (task_type, payload, max_attempts) VALUES ('retry', 'y', 2), ('boom', 'z', 2)")
	db.insert("later", "w")
	w, lb := newWorker(t, d.listen, taskpush.Options{})
	var laterMu sync.Mutex
	var laterAt []time.Time
	must(t, w.Handle("perm", 1, func(context.Context, *taskpush.Task) ([]byte, error) {
		return nil, taskpush.Permanent(errors.New("bad input"))
	}))
	must(t, w.Handle("retry", 1, func(context.Context, *taskpush.Task) ([]byte, error) {
		return nil, errors.New("flaky")
	}))
	must(t, w.Handle("boom", 1, func(context.Context, *taskpush.Task) ([]byte, error) {
		panic("handler bug")
	}))
	must(t, w.Handle("later", 1, func(_ context.Context, task *taskpush.Task) ([]byte, error) {
		laterMu.Lock()
		laterAt = append(laterAt, time.Now())
		laterMu.Unlock()
		if task.Attempt == 1 {
			return nil, taskpush.RetryAfter(1500*time.Millisecond, errors.New("rate limited"))
		}
		return []byte("ok"), nil
	}))
	start(t, w, lb)
	db.waitRows(t, "task_state = 3 AND task_type = 'perm' AND attempts = 1 AND err_msg = 'bad input'", 1)
	db.waitRows(t, "task_state = 3 AND task_type = 'retry' AND attempts = 2 AND err_msg = 'flaky'", 1)
	db.waitRows(t, "task_state = 3 AND task_type = 'boom' AND attempts = 2 AND err_msg = 'panic: handler bug'", 1)
	db.waitRows(t, "task_state = 2 AND task_type = 'later' AND attempts = 2 AND result = 'ok'", 1)
	laterMu.Lock()
	defer laterMu.Unlock()
	if len(laterAt) != 2 || laterAt[1].Sub(laterAt[0]) < 1500*time.Millisecond {
		t.Fatalf("RETRY_AFTER 1.5 s: delivered at %v", laterAt)
	}
}

// Never more handlers of a type at once than its concurrency.
func TestConcurrencyBound(t *testing.T) {
	needIntegration(t)
	t.Parallel()
	db := newDB(t)
	d := startDaemon(t, db, "127.0.0.1:0", true)
	db.insert("a", strings.Split(strings.Repeat("x,", 30), ",")[:30]...)
	db.insert("b", strings.Split(strings.Repeat("y,", 30), ",")[:30]...)
	var mu sync.Mutex
	now := map[string]int{}
	peak := map[string]int{}
	handler := func(ctx context.Context, task *taskpush.Task) ([]byte, error) {
		mu.Lock()
		now[task.Type]++
		if now[task.Type] > peak[task.Type] {
			peak[task.Type] = now[task.Type]
		}
		mu.Unlock()
		time.Sleep(20 * time.Millisecond)
		mu.Lock()
		now[task.Type]--
		mu.Unlock()
		return nil, nil
	}
	w, lb := newWorker(t, d.listen, taskpush.Options{})
	must(t, w.Handle("a", 3, handler))
	must(t, w.Handle("b", 2, handler))
	start(t, w, lb)
	db.waitRows(t, "task_state = 2", 60)
	mu.Lock()
	defer mu.Unlock()
	if peak["a"] > 3 || peak["b"] > 2 || peak["a"] < 1 || peak["b"] < 1 {
		t.Fatalf("peaks %v, bounds a 3, b 2", peak)
	}
}

// EXTEND keeps a short lease alive; CANCEL cancels the handler's context and
// the slot is free again once it answered.
func TestExtendAndCancel(t *testing.T) {
	needIntegration(t)
	t.Parallel()
	db := newDB(t)
	d := startDaemon(t, db, "127.0.0.1:0", true)
	db.exec("INSERT INTO task (task_type, payload, timeout_ms) VALUES ('long', 'e', 800)")
	cancelled := make(chan struct{})
	started := make(chan uint64, 1)
	w, lb := newWorker(t, d.listen, taskpush.Options{})
	must(t, w.Handle("long", 1, func(ctx context.Context, task *taskpush.Task) ([]byte, error) {
		end := time.Now().Add(2500 * time.Millisecond)
		for time.Now().Before(end) {
			if err := task.Extend(800 * time.Millisecond); err != nil {
				return nil, err
			}
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(200 * time.Millisecond):
			}
		}
		return []byte("extended"), nil
	}))
	must(t, w.Handle("stuck", 1, func(ctx context.Context, task *taskpush.Task) ([]byte, error) {
		if string(task.Payload) == "a" {
			started <- task.ID
			select {
			case <-ctx.Done():
				close(cancelled)
				return nil, ctx.Err()
			case <-time.After(waitBound):
			}
		}
		return []byte("done"), nil
	}))
	start(t, w, lb)
	db.waitRows(t, "task_state = 2 AND task_type = 'long' AND attempts = 1 AND result = 'extended'", 1)
	if s := w.Stats(); s.ExtendsSent < 5 || s.CancelsReceived != 0 {
		t.Fatalf("stats after the extended task: %+v", s)
	}
	db.insert("stuck", "a")
	var id uint64
	select {
	case id = <-started:
	case <-time.After(waitBound):
		t.Fatal("the stuck task did not start")
	}
	if ans := d.post(fmt.Sprintf("/cancel?id=%d", id)); !strings.Contains(ans, `"running"`) {
		t.Fatalf("POST /cancel: %s", ans)
	}
	select {
	case <-cancelled:
	case <-time.After(waitBound):
		t.Fatal("the handler's context was not cancelled")
	}
	db.waitRows(t, "task_state = 3 AND err_msg = 'cancelled'", 1)
	db.insert("stuck", "b")
	db.waitRows(t, "task_state = 2 AND payload = 'b'", 1)
	if s := w.Stats(); s.CancelsReceived != 1 {
		t.Fatalf("cancels received %d", s.CancelsReceived)
	}
}

// An idle worker stays connected over many heartbeat intervals; a frozen
// dispatcher (SIGSTOP) is declared lost after 3 and found again after SIGCONT.
func TestHeartbeatsAndSilence(t *testing.T) {
	needIntegration(t)
	t.Parallel()
	db := newDB(t)
	d := startDaemon(t, db, "127.0.0.1:0", true)
	w, lb := newWorker(t, d.listen, taskpush.Options{})
	must(t, w.Handle("hb", 2, func(context.Context, *taskpush.Task) ([]byte, error) { return []byte("ok"), nil }))
	start(t, w, lb)
	waitFor(t, "a connection", func() bool { return w.ConnectedVersion() == 3 })
	time.Sleep(10 * 200 * time.Millisecond) // 10 heartbeat intervals, idle
	if s := w.Stats(); s.Connections != 1 || s.Disconnects != 0 {
		t.Fatalf("an idle worker reconnected: %+v", s)
	}
	db.insert("hb", "1")
	db.waitRows(t, "task_state = 2", 1)

	d.signal(syscall.SIGSTOP)
	waitFor(t, "the frozen dispatcher declared lost", func() bool { return w.Stats().Disconnects >= 1 })
	if !lb.has("dispatcher silent for") {
		t.Errorf("no 'dispatcher silent' in the log")
	}
	d.signal(syscall.SIGCONT)
	db.insert("hb", "2")
	db.waitRows(t, "task_state = 2", 2)
}

// Tasks in flight across a dispatcher's SIGKILL and restart run once: the
// outcomes made while it was down are sent again, the running ones declared
// (HOLDING) and adopted.
func TestInventoryAcrossRestart(t *testing.T) {
	needIntegration(t)
	t.Parallel()
	db := newDB(t)
	listen := freePort(t)
	d := startDaemon(t, db, listen, true, "--adopt-grace-ms", "3000")
	db.insert("long", "early0", "early1", "early2", "late0", "late1", "late2")
	var mu sync.Mutex
	runs := map[uint64]int{}
	down, lateGo := make(chan struct{}), make(chan struct{})
	w, lb := newWorker(t, listen, taskpush.Options{})
	must(t, w.Handle("long", 6, func(ctx context.Context, task *taskpush.Task) ([]byte, error) {
		mu.Lock()
		runs[task.ID]++
		mu.Unlock()
		gate := lateGo
		if strings.HasPrefix(string(task.Payload), "early") {
			gate = down
		}
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return append([]byte("done-"), task.Payload...), nil
	}))
	start(t, w, lb)
	waitFor(t, "six tasks running", func() bool { mu.Lock(); defer mu.Unlock(); return len(runs) == 6 })
	d.kill()
	waitFor(t, "the worker to see the dispatcher gone", func() bool { return w.Stats().Disconnects >= 1 })
	close(down)
	waitFor(t, "three outcomes kept, three tasks running", func() bool { return w.Unconfirmed() == 3 && w.Held() == 3 })
	d.start(listen, true)
	db.waitRows(t, "task_state = 2 AND payload LIKE 'early%'", 3)
	waitFor(t, "three deliveries declared", func() bool { return w.Stats().DeliveriesDeclared == 3 })
	close(lateGo)
	db.waitRows(t, "task_state = 2", 6)
	waitFor(t, "every outcome confirmed", func() bool { return w.Unconfirmed() == 0 })
	if got := db.count("task_state = 2 AND attempts = 1 AND result = CONCAT('done-', payload)"); got != 6 {
		t.Fatalf("%d rows SUCCESSFUL at attempt 1, want 6", got)
	}
	mu.Lock()
	defer mu.Unlock()
	for id, c := range runs {
		if c != 1 {
			t.Fatalf("task %d ran %d times", id, c)
		}
	}
	if s := w.Stats(); s.TasksDropped != 0 || s.OutcomesForgotten != 0 || s.OutcomesResent < 3 {
		t.Fatalf("stats %+v", s)
	}
}

// A dead address, then a standby (NOT_LEADER), then the leader: the worker
// moves on at once (any backoff would be 30 s) and drains; the standby holds
// no worker. A producer given the standby first submits through the leader.
func TestAddressesDeadStandbyLeader(t *testing.T) {
	needIntegration(t)
	t.Parallel()
	db := newDB(t)
	leader := startDaemon(t, db, "127.0.0.1:0", true)
	standby := startDaemon(t, db, "127.0.0.1:0", false)
	if v, err := standby.stats(); err != nil || v["leader"] != false {
		t.Fatalf("the second taskpushd leads: %v %v", v, err)
	}
	dead := freePort(t)
	db.insert("sb", "1", "2", "3", "4", "5")
	w, lb := newWorker(t, dead+","+standby.listen+","+leader.listen,
		taskpush.Options{ReconnectMin: 30 * time.Second, ReconnectMax: 30 * time.Second})
	must(t, w.Handle("sb", 2, func(context.Context, *taskpush.Task) ([]byte, error) { return []byte("ok"), nil }))
	start(t, w, lb)
	db.waitRows(t, "task_state = 2", 5)
	if s := w.Stats(); s.Connections != 1 || s.ConnectAttempts < 3 {
		t.Fatalf("stats %+v", s)
	}
	if !lb.has("does not lead") {
		t.Errorf("no 'does not lead' in the log")
	}
	if v, _ := standby.stats(); v["workers"] != float64(0) {
		t.Fatalf("the standby holds %v workers", v["workers"])
	}
	// A producer given the standby first: its SUBMIT is answered UNAVAILABLE
	// there (nothing committed) and goes to the leader at once.
	c, err := taskpush.NewClient(standby.listen+","+leader.listen, taskpush.Options{Logf: lb.logf})
	must(t, err)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	rs, err := c.Submit(ctx, taskpush.NewTask{Type: "sb", Payload: []byte("submitted")})
	must(t, err)
	db.waitRows(t, fmt.Sprintf("task_id = %d AND task_state = 2", rs[0].TaskID), 1)
	if !lb.has("answered UNAVAILABLE") {
		t.Errorf("the standby's UNAVAILABLE not seen")
	}
}

// TLS with a client certificate and a token: a worker with both drains (a
// 3 MB payload and result among the tasks); without the client certificate,
// or with a wrong token, no session opens.
func TestTLSClientCertToken(t *testing.T) {
	needIntegration(t)
	t.Parallel()
	certs := makeCerts(t)
	p := func(n string) string { return filepath.Join(certs, n) }
	must(t, writeFile(p("token"), "s3cret-go\n"))
	db := newDB(t)
	admin, err := taskpush.TLSConfig(p("ca.pem"), "", "")
	must(t, err)
	d := startDaemonWith(t, db, "127.0.0.1:0", true, admin, "--tls-cert", p("server.pem"), "--tls-key", p("server.key"),
		"--tls-ca", p("ca.pem"), "--token-file", p("token"))
	db.insert("tls", "1", "2", "3")
	db.exec("INSERT INTO task (task_type, payload) SELECT 'tls', CONCAT(REPEAT('ab', 1500000), 'c')")
	cfg, err := taskpush.TLSConfig(p("ca.pem"), p("client.pem"), p("client.key"))
	must(t, err)
	w, lb := newWorker(t, d.listen, taskpush.Options{TLS: cfg, Token: "s3cret-go"})
	must(t, w.Handle("tls", 2, func(_ context.Context, task *taskpush.Task) ([]byte, error) {
		return append([]byte("r"), task.Payload...), nil
	}))
	start(t, w, lb)
	db.waitRows(t, "task_state = 2", 4)
	if got := db.count("task_state = 2 AND LENGTH(result) = 3000002"); got != 1 {
		t.Fatalf("the 3 MB result: %d rows", got)
	}

	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	noCert, _ := taskpush.TLSConfig(p("ca.pem"), "", "")
	for _, tc := range []struct {
		name  string
		opts  taskpush.Options
		wants string
	}{
		{"no client certificate", taskpush.Options{TLS: noCert, Token: "s3cret-go"}, ""},
		{"wrong token", taskpush.Options{TLS: cfg, Token: "wrong"}, "ERROR 3"},
	} {
		c, err := taskpush.NewClient(d.listen, tc.opts)
		must(t, err)
		_, err = c.Submit(ctx, taskpush.NewTask{Type: "tls"})
		c.Close()
		if !errors.Is(err, taskpush.ErrUnavailable) || !strings.Contains(err.Error(), tc.wants) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

// SUBMIT is acknowledged after commit: the rows are in the table when Submit
// returns; a dedup key gives the existing id; WAIT returns the outcome; an
// invalid task inserts nothing.
func TestSubmitCommitBeforeAck(t *testing.T) {
	needIntegration(t)
	t.Parallel()
	db := newDB(t)
	d := startDaemon(t, db, "127.0.0.1:0", true)
	c, err := taskpush.NewClient(d.listen, taskpush.Options{})
	must(t, err)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	tasks := make([]taskpush.NewTask, 10)
	for i := range tasks {
		tasks[i] = taskpush.NewTask{Type: "nobody", Payload: []byte(fmt.Sprint(i)), Priority: taskpush.PriorityHigh,
			DedupKey: fmt.Sprintf("k%d", i), MaxAttempts: 5, Delay: time.Hour}
	}
	rs, err := c.Submit(ctx, tasks...)
	must(t, err)
	ids := make([]string, len(rs))
	for i, r := range rs {
		if r.Duplicate || r.TaskID == 0 {
			t.Fatalf("receipt %d: %+v", i, r)
		}
		ids[i] = fmt.Sprint(r.TaskID)
	}
	// Read at once: committed before the answer.
	if got := db.count("task_id IN (" + strings.Join(ids, ",") + ") AND task_state = 0 AND task_priority = 2 AND max_attempts = 5"); got != 10 {
		t.Fatalf("%d of 10 acknowledged rows in the table", got)
	}
	dup, err := c.Submit(ctx, taskpush.NewTask{Type: "nobody", DedupKey: "k3"})
	must(t, err)
	if !dup[0].Duplicate || dup[0].TaskID != rs[3].TaskID {
		t.Fatalf("duplicate: %+v, want id %d", dup[0], rs[3].TaskID)
	}
	var inv *taskpush.InvalidError
	if _, err := c.Submit(ctx, taskpush.NewTask{Type: "trailing "}); !errors.As(err, &inv) {
		t.Fatalf("a type with a trailing space: %v", err)
	}

	w, lb := newWorker(t, d.listen, taskpush.Options{})
	must(t, w.Handle("echo", 2, func(_ context.Context, task *taskpush.Task) ([]byte, error) {
		return append([]byte("echo:"), task.Payload...), nil
	}))
	start(t, w, lb)
	wr, err := c.SubmitWait(ctx, taskpush.NewTask{Type: "echo", Payload: []byte("hi")})
	must(t, err)
	if o := wr[0].Outcome; o == nil || !o.Succeeded || string(o.Data) != "echo:hi" {
		t.Fatalf("waited outcome: %+v", o)
	}
	waitFor(t, "a worker connection", func() bool { return w.ConnectedVersion() == 3 })
	r, err := w.Submit(ctx, taskpush.NewTask{Type: "echo", Payload: []byte("from-worker")})
	must(t, err)
	db.waitRows(t, fmt.Sprintf("task_id = %d AND task_state = 2 AND result = 'echo:from-worker'", r.TaskID), 1)
}

// Run(ctx) drains when ctx is cancelled: the running tasks finish and their
// outcomes are written and confirmed; nothing more is taken.
func TestGracefulDrain(t *testing.T) {
	needIntegration(t)
	t.Parallel()
	db := newDB(t)
	d := startDaemon(t, db, "127.0.0.1:0", true)
	payloads := make([]string, 40)
	for i := range payloads {
		payloads[i] = fmt.Sprint(i)
	}
	db.insert("drain", payloads...)
	release := make(chan struct{})
	var mu sync.Mutex
	startedN := 0
	w, lb := newWorker(t, d.listen, taskpush.Options{})
	must(t, w.Handle("drain", 4, func(ctx context.Context, task *taskpush.Task) ([]byte, error) {
		mu.Lock()
		startedN++
		mu.Unlock()
		select {
		case <-release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return []byte("drained"), nil
	}))
	r := start(t, w, lb)
	waitFor(t, "four tasks running", func() bool { mu.Lock(); defer mu.Unlock(); return startedN == 4 })
	r.stop()
	time.Sleep(300 * time.Millisecond) // the STOP exchange; the handlers are still held
	select {
	case err := <-r.done:
		t.Fatalf("Run returned before its tasks finished: %v", err)
	default:
	}
	close(release)
	select {
	case err := <-r.done:
		must(t, err)
		r.done <- nil // for the cleanup
	case <-time.After(waitBound):
		t.Fatal("Run did not return after the drain")
	}
	mu.Lock()
	n := startedN
	mu.Unlock()
	if got := db.count("task_state = 2 AND attempts = 1 AND result = 'drained'"); got != n {
		t.Fatalf("%d rows SUCCESSFUL, %d tasks started", got, n)
	}
	if got := db.count("attempts = 0"); got != 40-n {
		t.Fatalf("%d rows never delivered, want %d", got, 40-n)
	}
	if w.Unconfirmed() != 0 || w.Held() != 0 {
		t.Fatalf("after the drain: %d unconfirmed, %d held", w.Unconfirmed(), w.Held())
	}
}

// Older sessions: workers offering version 1 and 2 drain (version 1 cannot
// submit); a dispatcher that refuses version 3 with ERROR VERSION is asked
// again in 2.
func TestProtocolVersions(t *testing.T) {
	needIntegration(t)
	t.Parallel()
	db := newDB(t)
	d := startDaemon(t, db, "127.0.0.1:0", true)
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	for _, v := range []int{1, 2} {
		typ := fmt.Sprintf("pv%d", v)
		w, lb := newWorker(t, d.listen, taskpush.Options{ProtocolVersion: v})
		must(t, w.Handle(typ, 1, func(context.Context, *taskpush.Task) ([]byte, error) { return []byte("ok"), nil }))
		start(t, w, lb)
		db.insert(typ, "x")
		db.waitRows(t, fmt.Sprintf("task_type = '%s' AND task_state = 2", typ), 1)
		if got := w.ConnectedVersion(); got != v {
			t.Fatalf("offered %d, session %d", v, got)
		}
		_, err := w.Submit(ctx, taskpush.NewTask{Type: typ})
		if (v == 1) != errors.Is(err, taskpush.ErrNoSubmit) {
			t.Fatalf("version %d submit: %v", v, err)
		}
	}
}

// DrainTimeout ends a drain that a handler holds up: its context is cancelled,
// its outcome dropped, Run returns, and the dispatcher takes the task back.
func TestDrainTimeoutAborts(t *testing.T) {
	needIntegration(t)
	t.Parallel()
	db := newDB(t)
	d := startDaemon(t, db, "127.0.0.1:0", true)
	db.insert("hang", "x")
	started, sawCancel := make(chan struct{}), make(chan struct{})
	w, lb := newWorker(t, d.listen, taskpush.Options{DrainTimeout: 300 * time.Millisecond})
	must(t, w.Handle("hang", 1, func(ctx context.Context, task *taskpush.Task) ([]byte, error) {
		close(started)
		<-ctx.Done()
		close(sawCancel)
		return []byte("too late"), nil
	}))
	r := start(t, w, lb)
	select {
	case <-started:
	case <-time.After(waitBound):
		t.Fatal("the task did not start")
	}
	r.stop()
	select {
	case <-sawCancel:
	case <-time.After(waitBound):
		t.Fatal("the handler's context was not cancelled after DrainTimeout")
	}
	select {
	case err := <-r.done:
		must(t, err)
		r.done <- nil
	case <-time.After(waitBound):
		t.Fatal("Run did not return")
	}
	if s := w.Stats(); s.TasksDropped != 1 || w.Unconfirmed() != 0 {
		t.Fatalf("stats %+v, unconfirmed %d", s, w.Unconfirmed())
	}
	// The connection closed with the delivery held: taken back, NEW again.
	db.waitRows(t, "task_state = 0 AND attempts = 1", 1)
	if db.count("result = 'too late'") != 0 {
		t.Fatal("the dropped outcome was written")
	}
}

// Command tp-conformance-worker is the Go module's conformance worker: the
// command line, the payload instructions and the event lines of
// tests/conformance/README.md, the same as the C, Python and Java conformance
// workers. tests/conformance/driver.py builds and runs it.
//
//	tp-conformance-worker --addr A[,B] --type T --concurrency N [--token T]
//	    [--tls-ca F [--tls-cert F --tls-key F]] [--reconnect-min-ms MS --reconnect-max-ms MS]
//	tp-conformance-worker --addr A [--token T] [--tls-*] --submit TYPE --payload P [--dedup K] [--wait]
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"taskpush.dev/taskpush"
)

// events prints one event line at a time (handlers run on several goroutines).
type events struct {
	mu    sync.Mutex
	start time.Time
}

func (e *events) emit(format string, args ...interface{}) {
	e.mu.Lock()
	defer e.mu.Unlock()
	fmt.Fprintf(os.Stdout, format+"\n", args...)
}

func (e *events) nowMs() int64 { return time.Since(e.start).Milliseconds() }

// errCancelled is what a handler returns once its context ended (CANCEL).
var errCancelled = errors.New("cancelled")

func (e *events) handle(ctx context.Context, t *taskpush.Task) (res []byte, err error) {
	words := bytes.SplitN(t.Payload, []byte(" "), 3)
	op := string(words[0])
	arg := ""
	if len(words) > 1 {
		arg = string(words[1])
	}
	e.emit("start %d %d %d %d %s %d", t.ID, t.Attempt, t.Epoch, int(t.Priority)+1, t.Type, e.nowMs())
	outcome := "ok"
	defer func() {
		e.emit("end %d %s %d", t.ID, outcome, e.nowMs())
	}()
	switch op {
	case "ok":
		return []byte(arg), nil
	case "fail":
		outcome = "fail"
		return nil, errors.New(arg)
	case "fail-permanent":
		outcome = "fail-permanent"
		return nil, taskpush.Permanent(errors.New(arg))
	case "retry-after":
		if t.Attempt == 1 {
			outcome = "retry-after"
			ms, _ := strconv.Atoi(arg)
			return nil, taskpush.RetryAfter(time.Duration(ms)*time.Millisecond, errors.New("later"))
		}
		return []byte("after"), nil
	case "crash":
		outcome = "crash"
		panic("conformance crash")
	case "big":
		n, _ := strconv.Atoi(arg)
		return bytes.Repeat([]byte("r"), n), nil
	case "sleep", "wait-cancel":
		total := 60 * time.Second
		if op == "sleep" {
			ms, _ := strconv.Atoi(arg)
			total = time.Duration(ms) * time.Millisecond
		}
		extend := len(words) > 2 && bytes.HasPrefix(words[2], []byte("extend")) && t.Lease > 0
		step := 50 * time.Millisecond
		if extend {
			step = t.Lease / 4
		}
		end := time.Now().Add(total)
		for time.Now().Before(end) {
			d := time.Until(end)
			if d > step {
				d = step
			}
			select {
			case <-ctx.Done():
				e.emit("cancelled %d", t.ID)
				outcome = "cancelled"
				return nil, errCancelled
			case <-time.After(d):
			}
			if extend {
				if err := t.Extend(t.Lease); err != nil {
					outcome = "gone"
					return nil, err
				}
			}
		}
		if op == "wait-cancel" {
			outcome = "not-cancelled"
			return nil, errors.New("never cancelled")
		}
		return []byte("slept"), nil
	}
	outcome = "unknown"
	return nil, taskpush.Permanent(fmt.Errorf("unknown instruction %q", op))
}

// watch prints `connections N` and `disconnects N` as the worker's counters move.
func (e *events) watch(w *taskpush.Worker, done <-chan struct{}) {
	var conns, discs int64
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
		}
		s := w.Stats()
		if s.Connections != conns {
			conns = s.Connections
			e.emit("connections %d", conns)
		}
		if s.Disconnects != discs {
			discs = s.Disconnects
			e.emit("disconnects %d", discs)
		}
	}
}

func submit(e *events, addr string, opts taskpush.Options, nt taskpush.NewTask, wait bool) error {
	cl, err := taskpush.NewClient(addr, opts)
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	var rs []taskpush.Receipt
	if wait {
		rs, err = cl.SubmitWait(ctx, nt)
	} else {
		rs, err = cl.Submit(ctx, nt)
	}
	var inv *taskpush.InvalidError
	if errors.As(err, &inv) {
		e.emit("refused %s", inv.Message)
		return nil
	}
	if err != nil {
		return err
	}
	kind := "new"
	if rs[0].Duplicate {
		kind = "duplicate"
	}
	e.emit("submitted %d %s", rs[0].TaskID, kind)
	if wait && rs[0].Outcome != nil {
		state := "failed"
		if rs[0].Outcome.Succeeded {
			state = "successful"
		}
		e.emit("outcome %d %s %s", rs[0].TaskID, state, rs[0].Outcome.Data)
	}
	return nil
}

func main() {
	addr := flag.String("addr", "", "HOST:PORT[,HOST:PORT...]")
	taskType := flag.String("type", "", "the task type to take")
	concurrency := flag.Int("concurrency", 1, "handlers at once")
	token := flag.String("token", "", "the dispatcher's token")
	ca := flag.String("tls-ca", "", "speak TLS; the CAs of the dispatcher's certificate")
	cert := flag.String("tls-cert", "", "the client certificate")
	key := flag.String("tls-key", "", "its key")
	rmin := flag.Int("reconnect-min-ms", 50, "first reconnect delay")
	rmax := flag.Int("reconnect-max-ms", 500, "longest reconnect delay")
	submitType := flag.String("submit", "", "submit one task of this type, then exit")
	payload := flag.String("payload", "", "its payload")
	dedup := flag.String("dedup", "", "its dedup key")
	wait := flag.Bool("wait", false, "wait for its outcome")
	flag.Parse()
	logger := log.New(os.Stderr, "", log.LstdFlags|log.Lmicroseconds)
	opts := taskpush.Options{Name: "conformance-go", Token: *token, Logf: logger.Printf,
		ReconnectMin: time.Duration(*rmin) * time.Millisecond, ReconnectMax: time.Duration(*rmax) * time.Millisecond}
	if *ca != "" {
		cfg, err := taskpush.TLSConfig(*ca, *cert, *key)
		if err != nil {
			logger.Fatal(err)
		}
		opts.TLS = cfg
	}
	e := &events{start: time.Now()}
	if *submitType != "" {
		nt := taskpush.NewTask{Type: *submitType, Payload: []byte(*payload), DedupKey: *dedup}
		if err := submit(e, *addr, opts, nt, *wait); err != nil {
			logger.Fatal(err)
		}
		return
	}
	w, err := taskpush.NewWorker(*addr, opts)
	if err != nil {
		logger.Fatal(err)
	}
	if err := w.Handle(*taskType, *concurrency, e.handle); err != nil {
		logger.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	done := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		e.watch(w, done)
		close(watched)
	}()
	e.emit("ready")
	if err := w.Run(ctx); err != nil {
		logger.Fatal(err)
	}
	close(done)
	<-watched
	s := w.Stats()
	e.emit("exit connections=%d disconnects=%d", s.Connections, s.Disconnects)
}

package taskpush_test

// The worker against raw peers on loopback TCP that break the protocol (as the
// C tests' fake dispatcher): every byte from the socket is hostile.

import (
	"bufio"
	"context"
	"encoding/binary"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"taskpush.dev/taskpush"
	"taskpush.dev/taskpush/wire"
)

// rawPeer accepts connections and runs script on each after reading its HELLO.
func rawPeer(t *testing.T, script func(c net.Conn, r *wire.Reader, hello *wire.Hello)) (string, *int64) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	var accepted int64
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			atomic.AddInt64(&accepted, 1)
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(waitBound))
				r := wire.NewReader(bufio.NewReader(c), wire.MaxBodyDefault)
				m, err := r.Read()
				if h, ok := m.(*wire.Hello); err == nil && ok {
					script(c, r, h)
				}
			}()
		}
	}()
	return l.Addr().String(), &accepted
}

func writeMsg(c net.Conn, m wire.Message) {
	b, err := wire.Encode(m)
	if err == nil {
		_, _ = c.Write(b)
	}
}

func welcome(version uint16) *wire.Welcome {
	return &wire.Welcome{Version: version, HeartbeatMs: 1000, MaxBody: wire.MaxBodyDefault, Server: []byte("raw")}
}

// expectError reads until an ERROR frame and returns its code (0 if none came).
func expectError(r *wire.Reader) uint16 {
	for {
		m, err := r.Read()
		if err != nil {
			return 0
		}
		if e, ok := m.(*wire.Error); ok {
			return e.Code
		}
	}
}

func runAgainst(t *testing.T, addr string) (*taskpush.Worker, *logBuffer) {
	w, lb := newWorker(t, addr, taskpush.Options{})
	must(t, w.Handle("t", 2, func(context.Context, *taskpush.Task) ([]byte, error) { return nil, nil }))
	start(t, w, lb)
	return w, lb
}

func TestHostileHTTPAnswer(t *testing.T) {
	t.Parallel()
	addr, _ := rawPeer(t, func(c net.Conn, _ *wire.Reader, _ *wire.Hello) {
		_, _ = c.Write([]byte("HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain\r\n\r\nno\n"))
	})
	_, lb := runAgainst(t, addr)
	waitFor(t, "the HTTP answer recognised", func() bool { return lb.has("an HTTP server answered") })
}

// A length prefix over the limit, a TASK of priority 3, a CONFIRM in the wrong
// place: each is answered ERROR (BAD_FRAME or UNEXPECTED) and a close, then
// the worker connects again.
func TestHostileFrames(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		send func(c net.Conn)
		code uint16
	}{
		{"too big", func(c net.Conn) {
			var b [4]byte
			binary.BigEndian.PutUint32(b[:], wire.MaxBodyDefault+1)
			_, _ = c.Write(b[:])
		}, wire.ErrCodeBadFrame},
		{"zero length", func(c net.Conn) { _, _ = c.Write([]byte{0, 0, 0, 0}) }, wire.ErrCodeBadFrame},
		{"task priority 3", func(c net.Conn) {
			b, _ := wire.Encode(&wire.Task{Delivery: wire.Delivery{TaskID: 1, Epoch: 1, Attempt: 1}, Priority: 2,
				TaskType: []byte("t")})
			b[4+21] = 3
			_, _ = c.Write(b)
		}, wire.ErrCodeBadFrame},
		{"HOLDING from the dispatcher", func(c net.Conn) {
			writeMsg(c, &wire.Holding{Deliveries: []wire.Delivery{{TaskID: 1}}})
		}, wire.ErrCodeUnexpected},
	}
	for _, tc := range cases {
		tc := tc
		t.Run(tc.name, func(t *testing.T) {
			codes := make(chan uint16, 8)
			addr, accepted := rawPeer(t, func(c net.Conn, r *wire.Reader, h *wire.Hello) {
				writeMsg(c, welcome(h.Version))
				tc.send(c)
				codes <- expectError(r)
			})
			runAgainst(t, addr)
			select {
			case got := <-codes:
				if got != tc.code {
					t.Fatalf("the worker answered ERROR %d, want %d", got, tc.code)
				}
			case <-time.After(waitBound):
				t.Fatal("no ERROR from the worker")
			}
			waitFor(t, "a second connection", func() bool { return atomic.LoadInt64(accepted) >= 2 })
		})
	}
}

// A WELCOME of a newer version than the HELLO's: the session speaks the
// worker's (3); one below the HELLO's is spoken in its version.
func TestWelcomeVersions(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ welcome, want int }{{4, 3}, {2, 2}} {
		addr, _ := rawPeer(t, func(c net.Conn, r *wire.Reader, h *wire.Hello) {
			writeMsg(c, welcome(uint16(tc.welcome)))
			for {
				if _, err := r.Read(); err != nil {
					return
				}
			}
		})
		w, _ := runAgainst(t, addr)
		waitFor(t, "a session", func() bool { return w.ConnectedVersion() != 0 })
		if got := w.ConnectedVersion(); got != tc.want {
			t.Fatalf("WELCOME %d: session version %d, want %d", tc.welcome, got, tc.want)
		}
	}
}

// ERROR VERSION to a HELLO of version 3: the worker asks again in 2 and
// speaks it.
func TestVersionFallback(t *testing.T) {
	t.Parallel()
	var offered []uint16
	var mu sync.Mutex
	addr, _ := rawPeer(t, func(c net.Conn, r *wire.Reader, h *wire.Hello) {
		mu.Lock()
		offered = append(offered, h.Version)
		mu.Unlock()
		if h.Version > 2 {
			writeMsg(c, &wire.Error{Code: wire.ErrCodeVersion, Message: []byte("version 1 or 2")})
			return
		}
		writeMsg(c, welcome(h.Version))
		for {
			if _, err := r.Read(); err != nil {
				return
			}
		}
	})
	w, _ := runAgainst(t, addr)
	waitFor(t, "a session", func() bool { return w.ConnectedVersion() != 0 })
	mu.Lock()
	defer mu.Unlock()
	if w.ConnectedVersion() != 2 || len(offered) != 2 || offered[0] != 3 || offered[1] != 2 {
		t.Fatalf("offered %v, session %d", offered, w.ConnectedVersion())
	}
}

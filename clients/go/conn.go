package taskpush

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"taskpush.dev/taskpush/wire"
)

// handshakeMaxBody bounds the answer to HELLO: a WELCOME or an ERROR; no TASK
// comes before WELCOME.
const handshakeMaxBody = 65536

// Errors a connection attempt or a session can end with; test them with
// errors.Is on what Worker and Client return or log.
var (
	ErrNotLeader = errors.New("taskpush: the dispatcher does not lead (NOT_LEADER)")
	ErrAuth      = errors.New("taskpush: the dispatcher refused the token (AUTH)")
	ErrVersion   = errors.New("taskpush: the dispatcher refused the protocol version (VERSION)")
	errClosed    = errors.New("closed by this side")
)

// DispatcherError is an ERROR frame from the dispatcher: the last frame of a
// connection, or the answer to HELLO.
type DispatcherError struct {
	Addr    string
	Code    uint16
	Message string
}

func (e *DispatcherError) Error() string {
	return fmt.Sprintf("%s sent ERROR %d: %s", e.Addr, e.Code, e.Message)
}

// Is matches ErrNotLeader, ErrAuth and ErrVersion by code.
func (e *DispatcherError) Is(target error) bool {
	switch target {
	case ErrNotLeader:
		return e.Code == wire.ErrCodeNotLeader
	case ErrAuth:
		return e.Code == wire.ErrCodeAuth
	case ErrVersion:
		return e.Code == wire.ErrCodeVersion
	}
	return false
}

// conn is one session with a dispatcher, after WELCOME. Frames are queued by
// any goroutine (send) and written by the writer goroutine of serve, which
// also sends HEARTBEAT when nothing was sent for an interval; serve's caller
// reads. A dispatcher silent for 3 intervals is lost.
type conn struct {
	nc      net.Conn
	addr    string
	version int
	hb      time.Duration
	maxBody uint32 // the dispatcher's limit for what we send
	server  string
	fr      *wire.Reader

	mu      sync.Mutex
	out     []byte // frames queued for the writer
	spare   []byte
	closed  bool
	closing bool // write what is queued, then close
	reason  error
	wake    chan struct{}
	done    chan struct{}
}

// deadlineReader renews the read deadline before each read of a session: a
// read that waits longer than 3 heartbeat intervals fails.
type deadlineReader struct {
	nc      net.Conn
	timeout time.Duration // 0 during the handshake (its own deadline holds)
}

func (d *deadlineReader) Read(p []byte) (int, error) {
	if d.timeout > 0 {
		if err := d.nc.SetReadDeadline(time.Now().Add(d.timeout)); err != nil {
			return 0, err
		}
	}
	return d.nc.Read(p)
}

// dial connects, sends HELLO and waits for WELCOME within timeout.
func dial(ctx context.Context, addr string, hello *wire.Hello, tlsCfg *tls.Config,
	timeout time.Duration) (*conn, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			nc.Close()
		}
	}()
	if dl, has := ctx.Deadline(); has {
		_ = nc.SetDeadline(dl)
	}
	if tlsCfg != nil {
		cfg := tlsCfg.Clone()
		if cfg.ServerName == "" {
			host, _, _ := net.SplitHostPort(addr)
			cfg.ServerName = host
		}
		tc := tls.Client(nc, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			return nil, fmt.Errorf("TLS handshake with %s: %w", addr, err)
		}
		nc = tc
	}
	frame, err := wire.Encode(hello)
	if err != nil {
		return nil, err
	}
	if _, err := nc.Write(frame); err != nil {
		return nil, err
	}
	dr := &deadlineReader{nc: nc}
	fr := wire.NewReader(bufio.NewReaderSize(dr, 64*1024), handshakeMaxBody)
	m, err := fr.Read()
	if err != nil {
		var tb wire.TooBigError
		if errors.As(err, &tb) && string(tb.Prefix[:]) == "HTTP" {
			return nil, fmt.Errorf("%s: an HTTP server answered: this is not a dispatcher's worker "+
				"port (taskpushd's admin port?); workers connect to taskpushd --listen", addr)
		}
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("%s: in answer to HELLO: %w", addr, err)
	}
	var w *wire.Welcome
	switch v := m.(type) {
	case *wire.Welcome:
		w = v
	case *wire.Error:
		return nil, &DispatcherError{Addr: addr, Code: v.Code, Message: string(v.Message)}
	default:
		return nil, fmt.Errorf("%s answered HELLO with %s", addr, m.Type())
	}
	// A WELCOME names the HELLO's version; one above it (a newer dispatcher)
	// is spoken to in ours, one below in its own.
	version := int(hello.Version)
	if int(w.Version) < version {
		version = int(w.Version)
	}
	if version < wire.VersionMin {
		sendErrorNow(nc, wire.ErrCodeVersion, "unexpected WELCOME version")
		return nil, fmt.Errorf("%s answered version %d", addr, w.Version)
	}
	_ = nc.SetDeadline(time.Time{})
	hb := time.Duration(w.HeartbeatMs) * time.Millisecond
	if hb < time.Millisecond {
		hb = time.Millisecond
	}
	dr.timeout = 3 * hb
	fr.SetMaxBody(wire.MaxBodyDefault)
	ok = true
	return &conn{nc: nc, addr: addr, version: version, hb: hb, maxBody: w.MaxBody,
		server: string(w.Server), fr: fr, wake: make(chan struct{}, 1), done: make(chan struct{})}, nil
}

func sendErrorNow(nc net.Conn, code uint16, text string) {
	if len(text) > 200 {
		text = text[:200]
	}
	b, err := wire.Encode(&wire.Error{Code: code, Message: []byte(text)})
	if err == nil {
		_ = nc.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = nc.Write(b)
	}
}

// send queues m; false once the session is closed.
func (c *conn) send(m wire.Message) bool {
	c.mu.Lock()
	if c.closed || c.closing {
		c.mu.Unlock()
		return false
	}
	out, err := wire.AppendFrame(c.out, m)
	c.out = out
	c.mu.Unlock()
	if err != nil {
		return false
	}
	c.kick()
	return true
}

func (c *conn) kick() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// closeAfterFlush ends the session once what is queued is written.
func (c *conn) closeAfterFlush() {
	c.mu.Lock()
	c.closing = true
	c.mu.Unlock()
	c.kick()
}

// abort ends the session at once, dropping what is queued.
func (c *conn) abort() { c.shutdown(errClosed) }

func (c *conn) isClosed() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

func (c *conn) shutdown(reason error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	c.reason = reason
	c.out = nil
	close(c.done)
	c.mu.Unlock()
	// The TCP connection itself: a TLS Close would first write close_notify,
	// which can wait 5 s on a peer that reads nothing.
	if tc, ok := c.nc.(*tls.Conn); ok {
		tc.NetConn().Close()
		return
	}
	c.nc.Close()
}

func (c *conn) err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reason
}

// serve runs the session until it ends and returns why. onFrame runs on this
// goroutine for every frame but ERROR; its error ends the session with
// ERROR UNEXPECTED.
func (c *conn) serve(onFrame func(wire.Message) error) error {
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		c.writeLoop()
	}()
	for {
		body, err := c.fr.ReadBody()
		if err != nil {
			if errors.Is(err, wire.ErrBadFrame) {
				sendErrorNow(c.nc, wire.ErrCodeBadFrame, err.Error())
				err = fmt.Errorf("bad frame from the dispatcher: %w", err)
			} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
				err = fmt.Errorf("dispatcher silent for %v", 3*c.hb)
			} else if err == io.EOF {
				err = errors.New("connection closed by the dispatcher")
			}
			c.shutdown(err)
			break
		}
		m, err := wire.Decode(body)
		if err != nil {
			sendErrorNow(c.nc, wire.ErrCodeBadFrame, err.Error())
			c.shutdown(fmt.Errorf("bad frame from the dispatcher: %w", err))
			break
		}
		if e, ok := m.(*wire.Error); ok {
			c.shutdown(&DispatcherError{Addr: c.addr, Code: e.Code, Message: string(e.Message)})
			break
		}
		if err := onFrame(m); err != nil {
			sendErrorNow(c.nc, wire.ErrCodeUnexpected, err.Error())
			c.shutdown(err)
			break
		}
	}
	<-writerDone
	return c.err()
}

func (c *conn) writeLoop() {
	beat, _ := wire.Encode(&wire.Heartbeat{})
	timer := time.NewTimer(c.hb)
	defer timer.Stop()
	lastSend := time.Now()
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return
		}
		buf := c.out
		c.out = c.spare[:0]
		c.spare = nil
		closing := c.closing
		c.mu.Unlock()
		if len(buf) == 0 && time.Since(lastSend) >= c.hb {
			buf = append(buf, beat...)
		}
		if len(buf) > 0 {
			_ = c.nc.SetWriteDeadline(time.Now().Add(3*c.hb + 10*time.Second))
			if _, err := c.nc.Write(buf); err != nil {
				c.shutdown(fmt.Errorf("write to %s: %w", c.addr, err))
				return
			}
			lastSend = time.Now()
			c.mu.Lock()
			if cap(buf) <= 1<<20 { // a huge result's buffer is not kept
				c.spare = buf[:0]
			}
			c.mu.Unlock()
			continue
		}
		if closing {
			c.shutdown(errClosed)
			return
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(time.Until(lastSend.Add(c.hb)))
		select {
		case <-c.wake:
		case <-timer.C:
		case <-c.done:
			return
		}
	}
}

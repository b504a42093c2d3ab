package taskpush

import (
	"errors"
	"strings"
	"testing"
	"time"

	"taskpush.dev/taskpush/wire"
)

func TestOutcomesBound(t *testing.T) {
	o := newOutcomes(3)
	for i := uint64(1); i <= 5; i++ {
		old := o.keep(&wire.Done{Delivery: wire.Delivery{TaskID: i}})
		if (i <= 3) != (old == nil) {
			t.Fatalf("keep %d: forgot %v", i, old)
		}
		if old != nil && old.TaskID != i-3 {
			t.Fatalf("keep %d forgot task %d, not the oldest", i, old.TaskID)
		}
	}
	if n := o.confirm([]wire.Delivery{{TaskID: 4}, {TaskID: 1}, {TaskID: 4}}); n != 1 || o.len() != 2 || o.evicted != 2 {
		t.Fatalf("confirm: %d, left %d, evicted %d", n, o.len(), o.evicted)
	}
	if p := o.pending(); p[0].TaskID != 3 || p[1].TaskID != 5 {
		t.Fatalf("pending order %v", p)
	}
}

func TestHoldingFramesSplit(t *testing.T) {
	keys := make([]wire.Delivery, 2*wire.MaxConfirm+1)
	hs := holdingFrames(keys)
	if len(hs) != 3 || len(hs[0].Deliveries) != wire.MaxConfirm || len(hs[2].Deliveries) != 1 {
		t.Fatalf("%d frames", len(hs))
	}
	for _, h := range hs {
		if _, err := wire.Encode(h); err != nil {
			t.Fatal(err)
		}
	}
	if holdingFrames(nil) != nil {
		t.Fatal("no keys: no frame")
	}
}

func TestBackoff(t *testing.T) {
	b := &backoff{min: 100 * time.Millisecond, max: time.Second}
	for i, ceiling := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		ceiling *= time.Millisecond
		if d := b.next(); d < ceiling/2 || d > ceiling {
			t.Fatalf("delay %d: %v outside [%v, %v]", i, d, ceiling/2, ceiling)
		}
	}
	b.capAt(1)
	if d := b.next(); d > 200*time.Millisecond {
		t.Fatalf("capped at 2^1: %v", d)
	}
	b.reset()
	if d := b.next(); d > 100*time.Millisecond {
		t.Fatalf("after reset: %v", d)
	}
}

func TestParseAddresses(t *testing.T) {
	got, err := ParseAddresses("10.0.0.5:7070, [::1]:7071")
	if err != nil || len(got) != 2 || got[1] != "[::1]:7071" {
		t.Fatalf("%v %v", got, err)
	}
	for _, bad := range []string{"", "host", "host:0", "host:70000", ":7070", "::1:7070", "a:1,"} {
		if _, err := ParseAddresses(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestOutcomeOfAndFit(t *testing.T) {
	cases := []struct {
		err     error
		outcome uint8
		delay   uint32
	}{
		{nil, wire.OutcomeSuccess, 0},
		{errors.New("x"), wire.OutcomeFailRetry, 0},
		{Permanent(errors.New("x")), wire.OutcomeFailPerm, 0},
		{RetryAfter(1500*time.Millisecond, nil), wire.OutcomeRetryAfter, 1500},
		{RetryAfter(-time.Second, nil), wire.OutcomeRetryAfter, 0},
	}
	for _, c := range cases {
		if o, _, d := outcomeOf([]byte("r"), c.err); o != c.outcome || d != c.delay {
			t.Errorf("%v: outcome %d delay %d", c.err, o, d)
		}
	}
	// A result over the dispatcher's limit becomes a permanent failure saying so;
	// an error text is cut at a UTF-8 boundary.
	d := doneFor(wire.Delivery{}, wire.OutcomeSuccess, make([]byte, 100), 0, 50)
	if d.Outcome != wire.OutcomeFailPerm || !strings.Contains(string(d.Data), "exceeds") {
		t.Fatalf("oversized result: %d %q", d.Outcome, d.Data)
	}
	text := []byte(strings.Repeat("é", 40000)) // 80,000 bytes
	d = doneFor(wire.Delivery{}, wire.OutcomeFailRetry, text, 0, wire.MaxBodyDefault)
	if len(d.Data) != 65534 {
		t.Fatalf("cut error text: %d bytes", len(d.Data))
	}
}

package wire

// The golden frames of tests/data/frames (tests/conformance/README.md): every
// valid frame decodes and encodes back byte for byte, every invalid one is
// refused, as by the C codec (tests/unit/test_proto.c) and the Python one
// (tests/python/test_codec.py).

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"testing/iotest"
)

func framesDir(t *testing.T, kind string) string {
	root := os.Getenv("TASKPUSH_SOURCE_ROOT")
	if root == "" {
		root = filepath.Join("..", "..", "..") // clients/go/wire
	}
	return filepath.Join(root, "tests", "data", "frames", kind)
}

type golden struct {
	name string
	data []byte
}

func loadGolden(t *testing.T, kind string, atLeast int) []golden {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(framesDir(t, kind), "*.bin"))
	if err != nil {
		t.Fatal(err)
	}
	if len(names) < atLeast {
		t.Fatalf("%d golden frames in %s, expected at least %d", len(names), framesDir(t, kind), atLeast)
	}
	sort.Strings(names)
	out := make([]golden, 0, len(names))
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, golden{filepath.Base(n), b})
	}
	return out
}

func TestGoldenValidRoundTrip(t *testing.T) {
	for _, g := range loadGolden(t, "valid", 20) {
		st, n := Check(g.data, MaxBodyDefault)
		if st != OK || int(n)+LenPrefix != len(g.data) {
			t.Errorf("valid/%s: %v, body %d, file %d bytes", g.name, st, n, len(g.data))
			continue
		}
		m, err := Decode(g.data[LenPrefix:])
		if err != nil {
			t.Errorf("valid/%s: %v", g.name, err)
			continue
		}
		out, err := Encode(m)
		if err != nil {
			t.Errorf("valid/%s: encode: %v", g.name, err)
			continue
		}
		if !bytes.Equal(out, g.data) {
			t.Errorf("valid/%s: re-encoded differs:\n got %x\nwant %x", g.name, head(out), head(g.data))
		}
	}
}

func head(b []byte) []byte {
	if len(b) > 64 {
		return b[:64]
	}
	return b
}

func TestGoldenInvalidRefused(t *testing.T) {
	for _, g := range loadGolden(t, "invalid", 30) {
		st, n := Check(g.data, MaxBodyDefault)
		switch st {
		case OK:
			if m, err := Decode(g.data[LenPrefix : LenPrefix+n]); err == nil {
				t.Errorf("invalid/%s decoded as %T %+v", g.name, m, m)
			} else if !errors.Is(err, ErrBadFrame) {
				t.Errorf("invalid/%s: %v does not wrap ErrBadFrame", g.name, err)
			}
		case Bad, TooBig:
			r := NewReader(bytes.NewReader(g.data), MaxBodyDefault)
			if _, err := r.ReadBody(); !errors.Is(err, ErrBadFrame) {
				t.Errorf("invalid/%s: reader gave %v, not a bad frame", g.name, err)
			}
		default:
			t.Errorf("invalid/%s: %v: not a whole frame", g.name, st)
		}
	}
}

// The valid frames in one stream, read one byte at a time, come out in order.
func TestGoldenStreamOneByteReads(t *testing.T) {
	gs := loadGolden(t, "valid", 20)
	var all []byte
	for _, g := range gs {
		all = append(all, g.data...)
	}
	r := NewReader(iotest.OneByteReader(bytes.NewReader(all)), MaxBodyDefault)
	for _, g := range gs {
		body, err := r.ReadBody()
		if err != nil || !bytes.Equal(body, g.data[LenPrefix:]) {
			t.Fatalf("%s: %v", g.name, err)
		}
	}
	if _, err := r.ReadBody(); err != io.EOF {
		t.Fatalf("after the last frame: %v, want EOF", err)
	}
}

func TestGoldenFields(t *testing.T) {
	dir := framesDir(t, "valid")
	read := func(name string) Message {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		m, err := Decode(b[LenPrefix:])
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return m
	}
	task, ok := read("task_small.bin").(*Task)
	if !ok || task.TaskID != 0x0102030405060708 || task.Epoch != 3 || task.Attempt != 1 ||
		task.TimeoutMs != 30000 || task.Priority != 1 || string(task.TaskType) != "resize" ||
		!bytes.HasPrefix(task.Payload, []byte(`{"w":`)) {
		t.Errorf("task_small: %+v", task)
	}
	if c, ok := read("confirm_max.bin").(*Confirm); !ok || len(c.Deliveries) != MaxConfirm {
		t.Errorf("confirm_max: %T", c)
	}
	if s, ok := read("submit_1000.bin").(*Submit); !ok || len(s.Tasks) != MaxSubmitTasks {
		t.Errorf("submit_1000: %T", s)
	}
}

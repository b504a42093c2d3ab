package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"
)

func mustEncode(t *testing.T, m Message) []byte {
	t.Helper()
	b, err := Encode(m)
	if err != nil {
		t.Fatalf("encode %T: %v", m, err)
	}
	return b
}

func TestRoundTripEveryType(t *testing.T) {
	d := Delivery{TaskID: 1<<63 + 5, Epoch: 7, Attempt: 2}
	msgs := []Message{
		&Hello{Version: 3, Capacity: 64, Name: []byte("w"), Types: [][]byte{[]byte("a"), []byte("b")}},
		&Hello{Version: 2, Capacity: 0},
		&Welcome{Version: 3, HeartbeatMs: 1000, MaxBody: MaxBodyDefault, Server: []byte("taskpushd")},
		&Heartbeat{}, &Stop{},
		&Error{Code: ErrCodeNotLeader, Message: []byte("standby")},
		&Task{Delivery: d, TimeoutMs: 5, Priority: 2, TaskType: []byte("t"), Payload: []byte{0, 0xff}},
		&Done{Delivery: d, Outcome: OutcomeRetryAfter, RetryAfterMs: 9, Data: []byte("later")},
		&Extend{Delivery: d, ExtendMs: 30000},
		&Cancel{Delivery: d},
		&Confirm{Deliveries: []Delivery{d, {1, 2, 3}}},
		&Holding{Deliveries: []Delivery{d}},
		&Progress{Delivery: d, Permille: 375, Message: []byte("page 3 of 8 \u2713")},
		&Progress{Delivery: d, Permille: 1000},
		&Submit{RequestID: 9, Flags: SubmitWait | SubmitGroupKey, Tasks: []SubmitTask{
			{Priority: 1, MaxAttempts: 3, TaskType: []byte("t"), DedupKey: []byte("k"), GroupKey: []byte("g")}}},
		&Submit{RequestID: 10, Flags: SubmitGroupKey | SubmitAfter, Tasks: []SubmitTask{
			{TaskType: []byte("t"), GroupKey: []byte("g"), After: []uint64{1, 1 << 40}},
			{TaskType: []byte("u"), After: []uint64{}}}},
		&Submitted{RequestID: 9, Status: StatusOK, Results: []SubmitResult{{ResultDuplicate, 4}}},
		&Submitted{RequestID: 9, Status: StatusInvalid, Message: []byte("why")},
		&Outcome{RequestID: 9, TaskID: 4, State: StateFailed, Data: []byte("err")},
	}
	for _, m := range msgs {
		b := mustEncode(t, m)
		if int(binary.BigEndian.Uint32(b)) != len(b)-LenPrefix || Type(b[4]) != m.Type() {
			t.Fatalf("%T: bad prefix or type", m)
		}
		back, err := Decode(b[LenPrefix:])
		if err != nil {
			t.Fatalf("%T: %v", m, err)
		}
		if again := mustEncode(t, back); !bytes.Equal(again, b) {
			t.Fatalf("%T: not canonical", m)
		}
	}
}

// An encoder refuses what a decoder refuses, and leaves dst unchanged.
func TestEncoderRefuses(t *testing.T) {
	long := func(n int) []byte { return bytes.Repeat([]byte("x"), n) }
	d := Delivery{1, 1, 1}
	bad := []Message{
		&Hello{Version: 3, Capacity: 0, Types: [][]byte{[]byte("a")}},
		&Hello{Version: 1, Capacity: 0},
		&Hello{Version: 3, Capacity: 1},
		&Hello{Version: 3, Capacity: 1, Types: make([][]byte, MaxTypes+1)},
		&Hello{Version: 3, Capacity: 1, Types: [][]byte{{}}},
		&Hello{Version: 3, Capacity: 1, Name: long(MaxNameLen + 1), Types: [][]byte{[]byte("a")}},
		&Hello{Version: 3, Capacity: 1, Token: long(MaxTokenLen + 1), Types: [][]byte{[]byte("a")}},
		&Welcome{Server: long(MaxNameLen + 1)},
		&Task{Delivery: d, Priority: 3, TaskType: []byte("t")},
		&Task{Delivery: d, TaskType: long(MaxTypeLen + 1)},
		&Done{Delivery: d, Outcome: 4},
		&Done{Delivery: d, Data: long(MaxBodyDefault)},
		&Confirm{},
		&Holding{Deliveries: make([]Delivery, MaxConfirm+1)},
		&Submit{RequestID: 1},
		&Submit{RequestID: 1, Flags: 8, Tasks: []SubmitTask{{TaskType: []byte("t")}}},
		&Submit{RequestID: 1, Tasks: []SubmitTask{{TaskType: []byte("t"), After: []uint64{7}}}},
		&Submit{RequestID: 1, Flags: SubmitAfter, Tasks: []SubmitTask{{TaskType: []byte("t"), After: make([]uint64, 0x10000)}}},
		&Submit{RequestID: 1, Tasks: []SubmitTask{{TaskType: []byte("t"), GroupKey: []byte("g")}}},
		&Submit{RequestID: 1, Flags: SubmitGroupKey, Tasks: []SubmitTask{{TaskType: []byte("t"), GroupKey: long(192)}}},
		&Submit{RequestID: 1, Tasks: []SubmitTask{{TaskType: []byte("t"), MaxAttempts: 1001}}},
		&Submit{RequestID: 1, Tasks: []SubmitTask{{TaskType: []byte("t"), DedupKey: long(192)}}},
		&Submit{RequestID: 1, Tasks: make([]SubmitTask, MaxSubmitTasks+1)},
		&Submitted{Status: StatusOK},
		&Submitted{Status: StatusInvalid, Results: []SubmitResult{{0, 1}}},
		&Submitted{Status: 3},
		&Outcome{State: 1},
		&Progress{Delivery: d, Permille: 1001},
		&Progress{Delivery: d, Message: []byte("a\x00b")},
		&Progress{Delivery: d, Message: []byte("\xc0\xaf")},
		&Progress{Delivery: d, Message: long(MaxProgressMsg + 1)},
	}
	for i, m := range bad {
		dst := []byte("keep")
		out, err := AppendFrame(dst, m)
		if !errors.Is(err, ErrBadFrame) || string(out) != "keep" {
			t.Errorf("case %d (%T): err %v, dst %q", i, m, err, out)
		}
	}
}

// A HELLO announcing more types than the body holds allocates for what is there
// only; a SUBMIT announcing 1000 tasks in a few bytes is refused before any.
func TestHostileCounts(t *testing.T) {
	body := []byte{byte(THello), 0, 3, 0, 0, 0, 1, 0, 0, 0, 0, 0, 64}
	if _, err := Decode(body); !errors.Is(err, ErrBadFrame) {
		t.Fatalf("hello with 64 missing types: %v", err)
	}
	sub := []byte{byte(TSubmit), 0, 0, 0, 1, 0, 0x03, 0xe8}
	if _, err := Decode(sub); err == nil || !strings.Contains(err.Error(), "1000 tasks") {
		t.Fatalf("submit of 1000 tasks in 0 bytes: %v", err)
	}
	st := []byte{byte(TSubmitted), 0, 0, 0, 1, 0, 0, 0x03, 0xe8}
	if _, err := Decode(st); !errors.Is(err, ErrBadFrame) {
		t.Fatalf("submitted of 1000 results in 0 bytes: %v", err)
	}
}

func TestReaderLimits(t *testing.T) {
	r := NewReader(bytes.NewReader([]byte{0, 0, 0, 0}), 100)
	if _, err := r.ReadBody(); !errors.Is(err, ErrBadFrame) {
		t.Fatalf("zero prefix: %v", err)
	}
	r = NewReader(bytes.NewReader([]byte("HTTP/1.0 400 Bad Request\r\n")), 100)
	var tb TooBigError
	if _, err := r.ReadBody(); !errors.As(err, &tb) || string(tb.Prefix[:]) != "HTTP" {
		t.Fatalf("HTTP answer: %v", err)
	}
	r = NewReader(bytes.NewReader([]byte{0, 0, 0, 5, 3}), 100)
	if _, err := r.ReadBody(); err != io.ErrUnexpectedEOF {
		t.Fatalf("cut frame: %v", err)
	}
	if st, _ := Check([]byte{0, 0, 0, 101}, 100); st != TooBig {
		t.Fatalf("101 > 100: %v", st)
	}
	if st, _ := Check([]byte{0, 0, 0, 100, 1}, 100); st != NeedMore {
		t.Fatalf("partial: %v", st)
	}
}

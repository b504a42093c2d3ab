// Package wire is the taskpush wire codec of proto/PROTOCOL.md: frame layouts,
// bounds, encode and decode, as pure functions of bytes (no sockets).
//
// It refuses what the C decoder (proto/proto.c) refuses, an encoder refuses what
// a decoder would refuse, and one message has exactly one byte sequence, so a
// decoded frame encodes back byte for byte (tests/conformance).
package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"unicode/utf8"
)

// Protocol constants, mirrors of proto/proto.h.
const (
	Version    = 3 // what this library speaks first
	VersionMin = 1 // the oldest version it can fall back to
	LenPrefix  = 4

	MaxBodyDefault  = 1<<24 - 1 + 4096 // a MEDIUMBLOB result plus a head
	MaxTypeLen      = 256
	MaxTypes        = 64
	MaxNameLen      = 256
	MaxTokenLen     = 1024
	MaxSubmitTasks  = 1000
	MaxDedupKeyLen  = 191
	MaxGroupKeyLen  = 191
	MaxPayloadLen   = 1<<24 - 1
	MaxAttempts     = 1000
	MaxConfirm      = 1024 // entries of one CONFIRM or HOLDING
	MaxProgressMsg  = 256  // bytes of a PROGRESS message (version 4)
	MaxPermille     = 1000
	DeliveryEntry   = 16
	DoneHead        = 22 // DONE body bytes before its data
	priorityMax     = 2
	outcomeMax      = OutcomeRetryAfter
	submitFlagsKnow = SubmitWait | SubmitGroupKey | SubmitAfter
)

// Type is a frame's first body byte.
type Type uint8

// Frame types.
const (
	THello     Type = 0x01
	TWelcome   Type = 0x02
	THeartbeat Type = 0x03
	TError     Type = 0x04
	TStop      Type = 0x05
	TTask      Type = 0x10
	TDone      Type = 0x11
	TExtend    Type = 0x12
	TCancel    Type = 0x13
	TConfirm   Type = 0x14
	THolding   Type = 0x15
	TProgress  Type = 0x16 // version 4: this library decodes it, and sends none
	TSubmit    Type = 0x20
	TSubmitted Type = 0x21
	TOutcome   Type = 0x22
)

var typeNames = map[Type]string{
	THello: "HELLO", TWelcome: "WELCOME", THeartbeat: "HEARTBEAT", TError: "ERROR",
	TStop: "STOP", TTask: "TASK", TDone: "DONE", TExtend: "EXTEND", TCancel: "CANCEL",
	TConfirm: "CONFIRM", THolding: "HOLDING", TProgress: "PROGRESS", TSubmit: "SUBMIT", TSubmitted: "SUBMITTED",
	TOutcome: "OUTCOME",
}

func (t Type) String() string {
	if n, ok := typeNames[t]; ok {
		return n
	}
	return fmt.Sprintf("type 0x%02x", uint8(t))
}

// DONE outcomes.
const (
	OutcomeSuccess    uint8 = 0
	OutcomeFailPerm   uint8 = 1
	OutcomeFailRetry  uint8 = 2
	OutcomeRetryAfter uint8 = 3
)

// ERROR codes.
const (
	ErrCodeBadFrame   uint16 = 1
	ErrCodeVersion    uint16 = 2
	ErrCodeAuth       uint16 = 3
	ErrCodeUnexpected uint16 = 4
	ErrCodeShutdown   uint16 = 5
	ErrCodeTimeout    uint16 = 6
	ErrCodeNotLeader  uint16 = 7
)

// SUBMIT flags, SUBMITTED statuses and results, OUTCOME states.
const (
	SubmitWait     uint8 = 0x01
	SubmitGroupKey uint8 = 0x02
	// SubmitAfter: each entry ends with a u16 count and that many u64 ids of tasks it
	// waits for (dependencies; a dispatcher of schema version 10 or later).
	SubmitAfter uint8 = 0x04

	StatusOK          uint16 = 0
	StatusInvalid     uint16 = 1
	StatusUnavailable uint16 = 2

	ResultInserted  uint8 = 0
	ResultDuplicate uint8 = 1

	StateSuccessful uint8 = 2
	StateFailed     uint8 = 3
)

// ErrBadFrame is wrapped by every decode and encode failure: a body that does
// not match its type's layout, or a message that cannot be encoded.
var ErrBadFrame = errors.New("bad frame")

func bad(format string, a ...interface{}) error {
	return fmt.Errorf("%w: %s", ErrBadFrame, fmt.Sprintf(format, a...))
}

// Message is one decoded frame.
type Message interface {
	Type() Type
}

// Delivery names one delivery: (task id, epoch, attempt).
type Delivery struct {
	TaskID  uint64
	Epoch   uint32
	Attempt uint32
}

type Hello struct {
	Version  uint16
	Capacity uint32
	Name     []byte
	Token    []byte
	Types    [][]byte
}

type Welcome struct {
	Version     uint16
	HeartbeatMs uint32
	MaxBody     uint32
	Server      []byte
}

type Heartbeat struct{}
type Stop struct{}

type Error struct {
	Code    uint16
	Message []byte
}

type Task struct {
	Delivery
	TimeoutMs uint32
	Priority  uint8
	TaskType  []byte
	Payload   []byte
}

type Done struct {
	Delivery
	Outcome      uint8
	RetryAfterMs uint32
	Data         []byte
}

type Extend struct {
	Delivery
	ExtendMs uint32
}

type Cancel struct{ Delivery }

type Confirm struct{ Deliveries []Delivery }

type Holding struct{ Deliveries []Delivery }

// Progress is a worker's report on a running delivery (protocol version 4):
// Permille 0 to 1000 and a message of valid UTF-8 without NUL.
type Progress struct {
	Delivery
	Permille uint16
	Message  []byte
}

// SubmitTask is one entry of a SUBMIT.
type SubmitTask struct {
	Priority    uint8
	MaxAttempts uint16
	DelayMs     uint32
	TimeoutMs   uint32
	TaskType    []byte
	DedupKey    []byte
	Payload     []byte
	GroupKey    []byte   // carried only with the flag SubmitGroupKey
	After       []uint64 // carried only with the flag SubmitAfter (at most 65535 on the wire)
}

type Submit struct {
	RequestID uint32
	Flags     uint8
	Tasks     []SubmitTask
}

type SubmitResult struct {
	Result uint8
	TaskID uint64
}

type Submitted struct {
	RequestID uint32
	Status    uint16
	Results   []SubmitResult
	Message   []byte
}

type Outcome struct {
	RequestID uint32
	TaskID    uint64
	State     uint8
	Data      []byte
}

func (*Hello) Type() Type     { return THello }
func (*Welcome) Type() Type   { return TWelcome }
func (*Heartbeat) Type() Type { return THeartbeat }
func (*Stop) Type() Type      { return TStop }
func (*Error) Type() Type     { return TError }
func (*Task) Type() Type      { return TTask }
func (*Done) Type() Type      { return TDone }
func (*Extend) Type() Type    { return TExtend }
func (*Cancel) Type() Type    { return TCancel }
func (*Confirm) Type() Type   { return TConfirm }
func (*Holding) Type() Type   { return THolding }
func (*Progress) Type() Type  { return TProgress }
func (*Submit) Type() Type    { return TSubmit }
func (*Submitted) Type() Type { return TSubmitted }
func (*Outcome) Type() Type   { return TOutcome }

// ---- decoding ----

// cursor reads fields from a body; every take checks the bytes left first.
type cursor struct {
	b   []byte
	off int
	err error
}

func (c *cursor) left() int { return len(c.b) - c.off }

func (c *cursor) need(n int, what string) bool {
	if c.err != nil {
		return false
	}
	if n < 0 || c.left() < n {
		c.err = bad("%s runs past the end of the body", what)
		return false
	}
	return true
}

func (c *cursor) u8(what string) uint8 {
	if !c.need(1, what) {
		return 0
	}
	v := c.b[c.off]
	c.off++
	return v
}

func (c *cursor) u16(what string) uint16 {
	if !c.need(2, what) {
		return 0
	}
	v := binary.BigEndian.Uint16(c.b[c.off:])
	c.off += 2
	return v
}

func (c *cursor) u32(what string) uint32 {
	if !c.need(4, what) {
		return 0
	}
	v := binary.BigEndian.Uint32(c.b[c.off:])
	c.off += 4
	return v
}

func (c *cursor) u64(what string) uint64 {
	if !c.need(8, what) {
		return 0
	}
	v := binary.BigEndian.Uint64(c.b[c.off:])
	c.off += 8
	return v
}

func (c *cursor) bytes(n int, what string) []byte {
	if !c.need(n, what) {
		return nil
	}
	v := c.b[c.off : c.off+n : c.off+n]
	c.off += n
	return v
}

// str reads a str16 of at most max bytes (and at least min).
func (c *cursor) str(min, max int, what string) []byte {
	n := int(c.u16(what + " length"))
	if c.err != nil {
		return nil
	}
	if n < min || n > max {
		c.err = bad("%s of %d bytes (%d to %d)", what, n, min, max)
		return nil
	}
	return c.bytes(n, what)
}

func (c *cursor) rest() []byte {
	if c.err != nil {
		return nil
	}
	v := c.b[c.off:len(c.b):len(c.b)]
	c.off = len(c.b)
	return v
}

func (c *cursor) delivery() Delivery {
	return Delivery{TaskID: c.u64("task_id"), Epoch: c.u32("epoch"), Attempt: c.u32("attempt")}
}

func (c *cursor) fail(format string, a ...interface{}) {
	if c.err == nil {
		c.err = bad(format, a...)
	}
}

// end checks that no byte follows the last field.
func (c *cursor) end(t Type) error {
	if c.err == nil && c.left() != 0 {
		c.err = bad("%d bytes after the last field of %s", c.left(), t)
	}
	return c.err
}

// helloCountsOK: a worker registers 1 .. 64 types with capacity >= 1; from
// version 2 on, a producer registers none with capacity 0.
func helloCountsOK(version uint16, capacity uint32, ntypes int) bool {
	if ntypes == 0 {
		return version >= 2 && capacity == 0
	}
	return capacity > 0 && ntypes <= MaxTypes
}

// Decode decodes one frame body (the bytes after the length prefix). The
// message's byte slices alias body. Every failure wraps ErrBadFrame.
func Decode(body []byte) (Message, error) {
	if len(body) == 0 {
		return nil, bad("empty body")
	}
	c := &cursor{b: body, off: 1}
	t := Type(body[0])
	var m Message
	switch t {
	case THello:
		h := &Hello{Version: c.u16("version"), Capacity: c.u32("capacity")}
		h.Name = c.str(0, MaxNameLen, "name")
		h.Token = c.str(0, MaxTokenLen, "token")
		ntypes := int(c.u16("ntypes"))
		if c.err == nil && !helloCountsOK(h.Version, h.Capacity, ntypes) {
			c.fail("capacity %d with %d types in version %d", h.Capacity, ntypes, h.Version)
		}
		if c.err == nil && ntypes > 0 {
			h.Types = make([][]byte, 0, ntypes)
		}
		for i := 0; i < ntypes && c.err == nil; i++ {
			h.Types = append(h.Types, c.str(1, MaxTypeLen, "task type"))
		}
		m = h
	case TWelcome:
		w := &Welcome{Version: c.u16("version"), HeartbeatMs: c.u32("heartbeat_ms"), MaxBody: c.u32("max_body")}
		w.Server = c.str(0, MaxNameLen, "server")
		m = w
	case THeartbeat:
		m = &Heartbeat{}
	case TStop:
		m = &Stop{}
	case TError:
		e := &Error{Code: c.u16("code")}
		e.Message = c.rest()
		m = e
	case TTask:
		k := &Task{Delivery: c.delivery(), TimeoutMs: c.u32("timeout_ms"), Priority: c.u8("priority")}
		if c.err == nil && k.Priority > priorityMax {
			c.fail("priority %d", k.Priority)
		}
		k.TaskType = c.str(1, MaxTypeLen, "task type")
		k.Payload = c.rest()
		m = k
	case TDone:
		d := &Done{Delivery: c.delivery(), Outcome: c.u8("outcome"), RetryAfterMs: c.u32("retry_after_ms")}
		if c.err == nil && d.Outcome > outcomeMax {
			c.fail("outcome %d", d.Outcome)
		}
		d.Data = c.rest()
		m = d
	case TExtend:
		m = &Extend{Delivery: c.delivery(), ExtendMs: c.u32("extend_ms")}
	case TCancel:
		m = &Cancel{Delivery: c.delivery()}
	case TConfirm, THolding:
		l := decodeList(c)
		if t == TConfirm {
			m = &Confirm{Deliveries: l}
		} else {
			m = &Holding{Deliveries: l}
		}
	case TProgress:
		p := &Progress{Delivery: c.delivery(), Permille: c.u16("permille")}
		if c.err == nil && p.Permille > MaxPermille {
			c.fail("permille %d", p.Permille)
		}
		p.Message = c.str(0, MaxProgressMsg, "progress message")
		if c.err == nil && !progressTextOK(p.Message) {
			c.fail("a progress message that is not UTF-8 without NUL")
		}
		m = p
	case TSubmit:
		m = decodeSubmit(c)
	case TSubmitted:
		m = decodeSubmitted(c)
	case TOutcome:
		o := &Outcome{RequestID: c.u32("request_id"), TaskID: c.u64("task_id"), State: c.u8("state")}
		if c.err == nil && o.State != StateSuccessful && o.State != StateFailed {
			c.fail("outcome state %d", o.State)
		}
		o.Data = c.rest()
		m = o
	default:
		return nil, bad("unknown %s", t)
	}
	if err := c.end(t); err != nil {
		return nil, err
	}
	return m, nil
}

func progressTextOK(b []byte) bool {
	return utf8.Valid(b) && bytes.IndexByte(b, 0) < 0
}

func decodeList(c *cursor) []Delivery {
	n := int(c.u16("n"))
	if c.err != nil {
		return nil
	}
	if n == 0 || n > MaxConfirm {
		c.fail("%d deliveries (1 to %d)", n, MaxConfirm)
		return nil
	}
	if c.left() != n*DeliveryEntry {
		c.fail("%d bytes for %d deliveries", c.left(), n)
		return nil
	}
	l := make([]Delivery, n)
	for i := range l {
		l[i] = c.delivery()
	}
	return l
}

func decodeSubmit(c *cursor) *Submit {
	s := &Submit{RequestID: c.u32("request_id"), Flags: c.u8("flags")}
	n := int(c.u16("ntasks"))
	if c.err != nil {
		return s
	}
	if s.Flags&^submitFlagsKnow != 0 {
		c.fail("SUBMIT flags 0x%02x", s.Flags)
		return s
	}
	if n == 0 || n > MaxSubmitTasks {
		c.fail("%d tasks (1 to %d)", n, MaxSubmitTasks)
		return s
	}
	// Each entry takes at least 19 bytes: a count beyond what the body can hold
	// allocates nothing.
	if c.left() < n*19 {
		c.fail("%d tasks in %d bytes", n, c.left())
		return s
	}
	s.Tasks = make([]SubmitTask, 0, n)
	for i := 0; i < n && c.err == nil; i++ {
		t := SubmitTask{Priority: c.u8("priority"), MaxAttempts: c.u16("max_attempts"),
			DelayMs: c.u32("delay_ms"), TimeoutMs: c.u32("timeout_ms")}
		if c.err == nil && (t.Priority > priorityMax || t.MaxAttempts > MaxAttempts) {
			c.fail("task %d: priority %d, max_attempts %d", i, t.Priority, t.MaxAttempts)
		}
		t.TaskType = c.str(1, MaxTypeLen, "task type")
		t.DedupKey = c.str(0, MaxDedupKeyLen, "dedup_key")
		plen := c.u32("payload length")
		if c.err == nil && plen > MaxPayloadLen {
			c.fail("payload of %d bytes", plen)
		}
		if c.err == nil {
			t.Payload = c.bytes(int(plen), "payload")
		}
		if s.Flags&SubmitGroupKey != 0 {
			t.GroupKey = c.str(0, MaxGroupKeyLen, "group_key")
		}
		if s.Flags&SubmitAfter != 0 {
			// The count is checked against the bytes left before anything is allocated.
			na := int(c.u16("after count"))
			if c.need(na*8, "after ids") {
				t.After = make([]uint64, na)
				for k := range t.After {
					t.After[k] = c.u64("after id")
				}
			}
		}
		s.Tasks = append(s.Tasks, t)
	}
	return s
}

func decodeSubmitted(c *cursor) *Submitted {
	s := &Submitted{RequestID: c.u32("request_id"), Status: c.u16("status")}
	n := int(c.u16("n"))
	if c.err != nil {
		return s
	}
	switch {
	case s.Status > StatusUnavailable:
		c.fail("SUBMITTED status %d", s.Status)
	case n > MaxSubmitTasks:
		c.fail("%d results", n)
	case s.Status != StatusOK && n != 0, s.Status == StatusOK && n == 0:
		c.fail("%d results with status %d", n, s.Status)
	case c.left() < n*9:
		c.fail("%d results in %d bytes", n, c.left())
	}
	if c.err != nil {
		return s
	}
	if n > 0 {
		s.Results = make([]SubmitResult, n)
	}
	for i := range s.Results {
		r := SubmitResult{Result: c.u8("result"), TaskID: c.u64("task_id")}
		if r.Result > ResultDuplicate {
			c.fail("result %d", r.Result)
		}
		s.Results[i] = r
	}
	s.Message = c.rest()
	return s
}

// ---- encoding ----

type enc struct {
	b   []byte
	err error
}

func (e *enc) u8(v uint8)   { e.b = append(e.b, v) }
func (e *enc) u16(v uint16) { e.b = binary.BigEndian.AppendUint16(e.b, v) }
func (e *enc) u32(v uint32) { e.b = binary.BigEndian.AppendUint32(e.b, v) }
func (e *enc) u64(v uint64) { e.b = binary.BigEndian.AppendUint64(e.b, v) }

func (e *enc) str(v []byte, min, max int, what string) {
	if len(v) < min || len(v) > max {
		e.fail("%s of %d bytes (%d to %d)", what, len(v), min, max)
		return
	}
	e.u16(uint16(len(v)))
	e.b = append(e.b, v...)
}

func (e *enc) delivery(d Delivery) {
	e.u64(d.TaskID)
	e.u32(d.Epoch)
	e.u32(d.Attempt)
}

func (e *enc) fail(format string, a ...interface{}) {
	if e.err == nil {
		e.err = bad(format, a...)
	}
}

func (e *enc) list(l []Delivery) {
	if len(l) == 0 || len(l) > MaxConfirm {
		e.fail("%d deliveries (1 to %d)", len(l), MaxConfirm)
		return
	}
	e.u16(uint16(len(l)))
	for _, d := range l {
		e.delivery(d)
	}
}

// AppendFrame appends m as one frame (length prefix and body) to dst. A message
// a decoder would refuse is an error wrapping ErrBadFrame, and dst comes back
// unchanged.
func AppendFrame(dst []byte, m Message) ([]byte, error) {
	start := len(dst)
	e := &enc{b: append(dst, 0, 0, 0, 0, uint8(m.Type()))}
	switch v := m.(type) {
	case *Hello:
		if !helloCountsOK(v.Version, v.Capacity, len(v.Types)) {
			e.fail("capacity %d with %d types in version %d", v.Capacity, len(v.Types), v.Version)
		}
		e.u16(v.Version)
		e.u32(v.Capacity)
		e.str(v.Name, 0, MaxNameLen, "name")
		e.str(v.Token, 0, MaxTokenLen, "token")
		e.u16(uint16(len(v.Types)))
		for _, t := range v.Types {
			e.str(t, 1, MaxTypeLen, "task type")
		}
	case *Welcome:
		e.u16(v.Version)
		e.u32(v.HeartbeatMs)
		e.u32(v.MaxBody)
		e.str(v.Server, 0, MaxNameLen, "server")
	case *Heartbeat, *Stop:
	case *Error:
		e.u16(v.Code)
		e.b = append(e.b, v.Message...)
	case *Task:
		if v.Priority > priorityMax {
			e.fail("priority %d", v.Priority)
		}
		e.delivery(v.Delivery)
		e.u32(v.TimeoutMs)
		e.u8(v.Priority)
		e.str(v.TaskType, 1, MaxTypeLen, "task type")
		e.b = append(e.b, v.Payload...)
	case *Done:
		if v.Outcome > outcomeMax {
			e.fail("outcome %d", v.Outcome)
		}
		e.delivery(v.Delivery)
		e.u8(v.Outcome)
		e.u32(v.RetryAfterMs)
		e.b = append(e.b, v.Data...)
	case *Extend:
		e.delivery(v.Delivery)
		e.u32(v.ExtendMs)
	case *Cancel:
		e.delivery(v.Delivery)
	case *Confirm:
		e.list(v.Deliveries)
	case *Holding:
		e.list(v.Deliveries)
	case *Progress:
		if v.Permille > MaxPermille || !progressTextOK(v.Message) {
			e.fail("progress of %d permille, message %q", v.Permille, v.Message)
		}
		e.delivery(v.Delivery)
		e.u16(v.Permille)
		e.str(v.Message, 0, MaxProgressMsg, "progress message")
	case *Submit:
		encodeSubmit(e, v)
	case *Submitted:
		encodeSubmitted(e, v)
	case *Outcome:
		if v.State != StateSuccessful && v.State != StateFailed {
			e.fail("outcome state %d", v.State)
		}
		e.u32(v.RequestID)
		e.u64(v.TaskID)
		e.u8(v.State)
		e.b = append(e.b, v.Data...)
	default:
		e.fail("cannot encode %T", m)
	}
	body := len(e.b) - start - LenPrefix
	if e.err == nil && body > MaxBodyDefault {
		e.fail("body of %d bytes", body)
	}
	if e.err != nil {
		return dst[:start], e.err
	}
	binary.BigEndian.PutUint32(e.b[start:], uint32(body))
	return e.b, nil
}

// Encode returns m as one frame, length prefix included.
func Encode(m Message) ([]byte, error) {
	return AppendFrame(nil, m)
}

func encodeSubmit(e *enc, s *Submit) {
	if s.Flags&^submitFlagsKnow != 0 {
		e.fail("SUBMIT flags 0x%02x", s.Flags)
	}
	if len(s.Tasks) == 0 || len(s.Tasks) > MaxSubmitTasks {
		e.fail("%d tasks (1 to %d)", len(s.Tasks), MaxSubmitTasks)
		return
	}
	e.u32(s.RequestID)
	e.u8(s.Flags)
	e.u16(uint16(len(s.Tasks)))
	for i := range s.Tasks {
		t := &s.Tasks[i]
		if t.Priority > priorityMax || t.MaxAttempts > MaxAttempts || len(t.Payload) > MaxPayloadLen {
			e.fail("task %d: priority %d, max_attempts %d, payload of %d bytes",
				i, t.Priority, t.MaxAttempts, len(t.Payload))
			return
		}
		e.u8(t.Priority)
		e.u16(t.MaxAttempts)
		e.u32(t.DelayMs)
		e.u32(t.TimeoutMs)
		e.str(t.TaskType, 1, MaxTypeLen, "task type")
		e.str(t.DedupKey, 0, MaxDedupKeyLen, "dedup_key")
		e.u32(uint32(len(t.Payload)))
		e.b = append(e.b, t.Payload...)
		if s.Flags&SubmitGroupKey != 0 {
			e.str(t.GroupKey, 0, MaxGroupKeyLen, "group_key")
		} else if len(t.GroupKey) != 0 {
			e.fail("task %d has a group_key without the GROUP_KEY flag", i)
			return
		}
		if s.Flags&SubmitAfter != 0 {
			if len(t.After) > 0xFFFF {
				e.fail("task %d waits for %d tasks (at most 65535 on the wire)", i, len(t.After))
				return
			}
			e.u16(uint16(len(t.After)))
			for _, id := range t.After {
				e.u64(id)
			}
		} else if len(t.After) != 0 {
			e.fail("task %d has after ids without the AFTER flag", i)
		}
	}
}

func encodeSubmitted(e *enc, s *Submitted) {
	n := len(s.Results)
	if s.Status > StatusUnavailable || n > MaxSubmitTasks || (s.Status == StatusOK) != (n > 0) {
		e.fail("SUBMITTED status %d with %d results", s.Status, n)
		return
	}
	e.u32(s.RequestID)
	e.u16(s.Status)
	e.u16(uint16(n))
	for _, r := range s.Results {
		if r.Result > ResultDuplicate {
			e.fail("result %d", r.Result)
		}
		e.u8(r.Result)
		e.u64(r.TaskID)
	}
	e.b = append(e.b, s.Message...)
}

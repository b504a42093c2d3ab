package wire

import (
	"encoding/binary"
	"fmt"
	"io"
)

// Status is what Check finds in buffered bytes (proto_frame_check).
type Status int

const (
	OK       Status = 0
	NeedMore Status = 1
	TooBig   Status = -1
	Bad      Status = -2
)

func (s Status) String() string {
	switch s {
	case OK:
		return "OK"
	case NeedMore:
		return "NEED_MORE"
	case TooBig:
		return "TOO_BIG"
	}
	return "BAD"
}

// Check looks at buffered bytes: OK with the body length when a whole frame is
// there, NeedMore, or TooBig/Bad decided from the 4 prefix bytes alone.
func Check(buf []byte, maxBody uint32) (Status, uint32) {
	if len(buf) < LenPrefix {
		return NeedMore, 0
	}
	n := binary.BigEndian.Uint32(buf)
	switch {
	case n == 0:
		return Bad, 0
	case n > maxBody:
		return TooBig, n
	case uint64(len(buf)) < uint64(LenPrefix)+uint64(n):
		return NeedMore, n
	}
	return OK, n
}

// Reader reads whole frames from a stream. It never allocates on a length it
// has not checked against its limit.
type Reader struct {
	r       io.Reader
	maxBody uint32
	head    [LenPrefix]byte
}

// NewReader reads frames of at most maxBody body bytes from r (give it a
// buffered reader: it reads the prefix and the body separately).
func NewReader(r io.Reader, maxBody uint32) *Reader {
	return &Reader{r: r, maxBody: maxBody}
}

// SetMaxBody changes the limit for the frames read after it.
func (fr *Reader) SetMaxBody(maxBody uint32) { fr.maxBody = maxBody }

// ReadBody returns the next frame's body, newly allocated. A zero or too large
// prefix is an error wrapping ErrBadFrame; a stream cut inside a frame is
// io.ErrUnexpectedEOF.
func (fr *Reader) ReadBody() ([]byte, error) {
	if _, err := io.ReadFull(fr.r, fr.head[:]); err != nil {
		return nil, err
	}
	st, n := Check(fr.head[:], fr.maxBody)
	switch st {
	case Bad:
		return nil, bad("a frame of length 0")
	case TooBig:
		return nil, TooBigError{Prefix: fr.head, Len: n, Max: fr.maxBody}
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(fr.r, body); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return body, nil
}

// Read returns the next decoded frame.
func (fr *Reader) Read() (Message, error) {
	body, err := fr.ReadBody()
	if err != nil {
		return nil, err
	}
	return Decode(body)
}

// TooBigError is a length prefix over the reader's limit; Prefix keeps the
// four bytes, so that a caller can recognise an HTTP answer ("HTTP").
type TooBigError struct {
	Prefix [LenPrefix]byte
	Len    uint32
	Max    uint32
}

func (e TooBigError) Error() string {
	return fmt.Sprintf("bad frame: a body of %d bytes, over the limit of %d", e.Len, e.Max)
}

func (e TooBigError) Unwrap() error { return ErrBadFrame }

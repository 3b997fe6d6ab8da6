// Package wire is the binary encoding's primitives the ledger's log
// entries, results and records are written with: varints, length-prefixed
// strings, and a decoder whose first error sticks. It imports nothing of
// ours.
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrMalformed marks bytes that are not a valid command or result: a
// sender that gets it back must not send the same bytes again.
var ErrMalformed = errors.New("malformed encoding")

// MaxVarintBytes is the longest varint encoding of a 64-bit value.
const MaxVarintBytes = binary.MaxVarintLen64

// MaxStringBytes bounds one decoded string: ids are at most a few hundred
// bytes; a longer length is a corrupt or hostile entry.
const MaxStringBytes = 1 << 16

// AppendUvarint appends v as an unsigned varint.
func AppendUvarint(b []byte, v uint64) []byte { return binary.AppendUvarint(b, v) }

// AppendVarint appends v as a signed varint.
func AppendVarint(b []byte, v int64) []byte { return binary.AppendVarint(b, v) }

// AppendString appends s, its length first.
func AppendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// UvarintLen is the length of n as an unsigned varint.
func UvarintLen(n int) int {
	l := 1
	for n >= 0x80 {
		n >>= 7
		l++
	}
	return l
}

// Decoder reads the fields appended above from B. The first error sticks
// in Err; later reads return zero values, and Finish reports it (or
// trailing bytes).
type Decoder struct {
	B   []byte
	Err error
}

// Fail records a malformed field, unless an error came first.
func (d *Decoder) Fail(what string) {
	if d.Err == nil {
		d.Err = fmt.Errorf("%w: bad %s", ErrMalformed, what)
	}
	d.B = nil
}

// Uvarint reads an unsigned varint.
func (d *Decoder) Uvarint() uint64 {
	if d.Err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.B)
	if n <= 0 {
		d.Fail("unsigned varint")
		return 0
	}
	d.B = d.B[n:]
	return v
}

// Varint reads a signed varint (zig-zag over an unsigned one, as
// AppendVarint writes it).
func (d *Decoder) Varint() int64 {
	u := d.Uvarint()
	x := int64(u >> 1)
	if u&1 != 0 {
		x = ^x
	}
	return x
}

// String reads a length-prefixed string (a copy).
func (d *Decoder) String() string { return string(d.Bytes()) }

// Strings reads len(dst) length-prefixed strings that follow each other
// into dst, copied into one allocation they share instead of one each:
// each keeps the others alive, so the caller reads together only strings
// that live about as long. On an error dst is left empty.
func (d *Decoder) Strings(dst []string) {
	span := d.B
	for range dst {
		d.Bytes()
	}
	if d.Err != nil {
		clear(dst)
		return
	}
	all := string(span[:len(span)-len(d.B)])
	r := Decoder{B: span[:len(all)]}
	for i := range dst {
		p := r.Bytes()
		at := len(all) - len(r.B) - len(p)
		dst[i] = all[at : at+len(p)]
	}
}

// Bytes is String without a copy: the bytes stay those of the input.
func (d *Decoder) Bytes() []byte {
	n := d.Uvarint()
	if d.Err != nil {
		return nil
	}
	if n > MaxStringBytes || n > uint64(len(d.B)) {
		d.Fail("string length")
		return nil
	}
	s := d.B[:n:n]
	d.B = d.B[n:]
	return s
}

// Count reads an element count, refusing one that the remaining bytes
// cannot hold at minBytes each (so a forged count cannot make the decoder
// allocate much).
func (d *Decoder) Count(minBytes int) int {
	n := d.Uvarint()
	if d.Err != nil {
		return 0
	}
	if n > uint64(len(d.B)/minBytes) {
		d.Fail("element count")
		return 0
	}
	return int(n)
}

// Byte reads one byte.
func (d *Decoder) Byte() byte {
	if d.Err != nil {
		return 0
	}
	if len(d.B) == 0 {
		d.Fail("byte")
		return 0
	}
	v := d.B[0]
	d.B = d.B[1:]
	return v
}

// Finish is the first error, or one for bytes left unread.
func (d *Decoder) Finish() error {
	if d.Err == nil && len(d.B) > 0 {
		d.Err = fmt.Errorf("%w: %d trailing bytes", ErrMalformed, len(d.B))
	}
	return d.Err
}

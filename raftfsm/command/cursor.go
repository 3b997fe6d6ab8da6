package command

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Cursor names a place in the feed: the event with sequence Seq, applied
// at log index Index. The zero cursor is the feed's start.
type Cursor struct {
	Index uint64
	Seq   uint64
}

// String is the cursor's wire form, "<log index>-<sequence>"; the zero
// cursor is "0".
func (c Cursor) String() string {
	if c == (Cursor{}) {
		return "0"
	}
	return strconv.FormatUint(c.Index, 10) + "-" + strconv.FormatUint(c.Seq, 10)
}

// ErrBadCursor marks a cursor that is not of the wire form, or that names
// no event this feed ever had.
var ErrBadCursor = errors.New("bad cursor")

// ParseCursor reads a cursor's wire form; "" and "0" are the start.
func ParseCursor(s string) (Cursor, error) {
	if s == "" || s == "0" {
		return Cursor{}, nil
	}
	i, q, ok := strings.Cut(s, "-")
	if !ok {
		return Cursor{}, fmt.Errorf("%w %q: want <log index>-<sequence>", ErrBadCursor, s)
	}
	index, err1 := strconv.ParseUint(i, 10, 64)
	seq, err2 := strconv.ParseUint(q, 10, 64)
	if err1 != nil || err2 != nil || seq == 0 || index == 0 {
		return Cursor{}, fmt.Errorf("%w %q: want <log index>-<sequence>, both positive", ErrBadCursor, s)
	}
	return Cursor{Index: index, Seq: seq}, nil
}

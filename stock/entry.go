package stock

// Entry states of GET /v1/skus/{sku}/entries/{user}.
const (
	EntryEntered    = "entered"
	EntryWon        = "won"
	EntryWaitlisted = "waitlisted"
	EntryLost       = "lost"
)

// EntryStatus is where one entrant stands.
type EntryStatus struct {
	Entry    Entry
	State    string
	OrderID  string // set when won
	Position int64  // set when waitlisted: 1 is next
	Rank     int64  // the entry's place in the draw, from 1; 0 before it
}

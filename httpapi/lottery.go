package httpapi

import (
	"context"
	"encoding/hex"
	"errors"
	"stockd.dev/stockd/engine/control"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"stockd.dev/stockd/engine"
	"stockd.dev/stockd/httpapi/deductwire"
	"stockd.dev/stockd/stock"
)

// lotteryJSON is a lottery sale's part of GET /v1/skus/{sku}.
type lotteryJSON struct {
	State          string `json:"state"` // entering, drawing, drawn
	EntriesCloseAt string `json:"entries_close_at"`
	Entries        int64  `json:"entries"`
	SeedCommitment string `json:"seed_commitment"`
	DrawnAt        string `json:"drawn_at,omitempty"`
	Winners        int64  `json:"winners,omitempty"`
	Promoted       int64  `json:"promoted,omitempty"`
	WaitlistLost   bool   `json:"waitlist_lost,omitempty"`
}

func lotteryView(r *stock.SKU) *lotteryJSON {
	lt := r.Lottery
	if lt == nil {
		return nil
	}
	out := &lotteryJSON{
		State:          "entering",
		EntriesCloseAt: stamp(r.Config.EntriesCloseAtUnixNano),
		Entries:        lt.Entries, SeedCommitment: hex.EncodeToString(lt.SeedCommitment),
		Winners: lt.Winners, Promoted: lt.Promoted, WaitlistLost: lt.WaitlistLostAtUnixNano != 0,
	}
	switch {
	case lt.Drawn():
		out.State, out.DrawnAt = "drawn", stamp(lt.DrawnAtUnixNano)
	case time.Now().UnixNano() >= r.Config.EntriesCloseAtUnixNano || r.Closed():
		out.State = "drawing"
	}
	return out
}

// enterRequest is the body of POST /v1/skus/{sku}/enter.
type enterRequest struct {
	User      string `json:"user"`
	RequestID string `json:"request_id,omitempty"`
}

// entryResponse is an entrant's standing: the answer of an entry and of
// GET /v1/skus/{sku}/entries/{user}.
type entryResponse struct {
	EntryID    string `json:"entry_id"`
	SKU        string `json:"sku"`
	User       string `json:"user"`
	State      string `json:"state"`
	OrderID    string `json:"order_id,omitempty"`
	OrderState string `json:"order_state,omitempty"`
	Position   int64  `json:"position,omitempty"`
	Rank       int64  `json:"rank,omitempty"`
	EnteredAt  string `json:"entered_at"`
	// AppliedIndex: the answer holds every log entry up to this one (0 on
	// an entry's answer).
	AppliedIndex uint64 `json:"applied_index,omitempty"`
}

func entryJSON(st stock.EntryStatus, o *stock.Order) entryResponse {
	out := entryResponse{EntryID: st.Entry.ID(), SKU: st.Entry.SKU, User: st.Entry.User, State: st.State,
		OrderID: st.OrderID, Position: st.Position, Rank: st.Rank, EnteredAt: stamp(st.Entry.AtUnixNano)}
	if o != nil {
		out.OrderState = string(o.State)
	}
	return out
}

func (s *Server) handleEnter(ctx *fasthttp.RequestCtx, sku []byte) {
	if !validID(sku) {
		writeRaw(ctx, fasthttp.StatusBadRequest, bodyBadSKU)
		return
	}
	var read deductwire.Reader
	user, requestID, bad := read.ReadEntry(&ctx.Request)
	if bad != nil {
		writeRaw(ctx, fasthttp.StatusBadRequest, bad)
		return
	}
	req := enterRequest{User: string(user), RequestID: string(requestID)}
	entry, err := s.engine.Enter(context.Background(), string(sku), req.User, req.RequestID)
	if err != nil {
		writeLotteryError(ctx, err)
		return
	}
	st := stock.EntryStatus{Entry: entry, State: stock.EntryEntered}
	var order *stock.Order
	if v, ok := s.engine.SKU(string(sku)); ok && v.Row.Lottery != nil && v.Row.Lottery.Drawn() {
		// A repeat after the draw: where the entrant stands now.
		if now, o, ok, err := s.engine.EntryStatus(string(sku), req.User); err == nil && ok {
			st, order = now, o
		}
	}
	writeJSON(ctx, fasthttp.StatusAccepted, entryJSON(st, order))
}

// writeLotteryError maps Enter's errors onto the contract's codes.
func writeLotteryError(ctx *fasthttp.RequestCtx, err error) {
	var notStarted *control.NotStartedError
	switch {
	case errors.As(err, &notStarted):
		// The deduct's not_started answer, start time and Retry-After.
		code, body, retryAfter := deductAnswer(&engine.DeductResult{Status: engine.StatusNotStarted, StartAt: notStarted.At}, nil)
		ctx.Response.Header.Set("Retry-After", strconv.FormatInt(retryAfter, 10))
		writeRaw(ctx, code, body)
	case errors.Is(err, control.ErrNotLottery):
		writeError(ctx, fasthttp.StatusConflict, "not_a_lottery", err.Error())
	case errors.Is(err, control.ErrEntriesClosed):
		writeError(ctx, fasthttp.StatusConflict, "entries_closed", err.Error())
	case errors.Is(err, control.ErrRequestIDReused):
		writeError(ctx, fasthttp.StatusUnprocessableEntity, "request_id_reused", err.Error())
	case errors.Is(err, control.ErrBusy):
		ctx.Response.Header.Set("Retry-After", "1")
		writeError(ctx, fasthttp.StatusTooManyRequests, "rate_limited", err.Error())
	default:
		writeEngineError(ctx, err)
	}
}

func (s *Server) handleEntryStatus(ctx *fasthttp.RequestCtx, sku, user []byte) {
	if !validID(sku) {
		writeRaw(ctx, fasthttp.StatusBadRequest, bodyBadSKU)
		return
	}
	if !deductwire.ValidUserID(user) { // the path's user, percent-decoded: as an entry's body gave it
		writeRaw(ctx, fasthttp.StatusBadRequest, deductwire.BodyBadUser)
		return
	}
	if !s.readGate(ctx) {
		return
	}
	applied := s.engine.AppliedIndex()
	st, o, ok, err := s.engine.EntryStatus(string(sku), string(user))
	if err == nil && !ok {
		if !s.caughtUp(ctx) {
			return
		}
		applied = s.engine.AppliedIndex()
		st, o, ok, err = s.engine.EntryStatus(string(sku), string(user))
	}
	if err != nil {
		writeEngineError(ctx, err)
		return
	}
	if !ok {
		writeError(ctx, fasthttp.StatusNotFound, "not_found", "no entry of this user in this lottery")
		return
	}
	out := entryJSON(st, o)
	out.AppliedIndex = applied
	writeJSON(ctx, fasthttp.StatusOK, out)
}

// entryLine is one line of GET /v1/skus/{sku}/entries.
type entryLine struct {
	EntryID   string `json:"entry_id"`
	Seq       int64  `json:"seq"`
	User      string `json:"user"`
	RequestID string `json:"request_id,omitempty"`
	At        string `json:"at"`
}

// entriesEnd is the last line of the entries stream: how many, and the
// state they are from.
type entriesEnd struct {
	Done         bool   `json:"done"`
	Entries      int64  `json:"entries"`
	AppliedIndex uint64 `json:"applied_index"`
	Error        string `json:"error,omitempty"`
}

func (s *Server) handleSaleEntries(ctx *fasthttp.RequestCtx, sku []byte) {
	if !validID(sku) {
		writeRaw(ctx, fasthttp.StatusBadRequest, bodyBadSKU)
		return
	}
	v, ok, answered := s.saleCaughtUp(ctx, sku)
	if answered {
		return
	}
	if !ok || v.Row.Lottery == nil {
		writeError(ctx, fasthttp.StatusNotFound, "not_found", "no lottery with this sku")
		return
	}
	name := string(sku)
	streamNDJSON(ctx, 1024, func(emit func(any) error) any {
		end := entriesEnd{}
		applied, err := s.engine.SaleEntries(name, func(e *stock.Entry) error {
			end.Entries++
			return emit(entryLine{EntryID: e.ID(), Seq: e.Seq, User: e.User, RequestID: e.RequestID, At: stamp(e.AtUnixNano)})
		})
		if errors.Is(err, control.ErrStreamStopped) {
			return nil
		}
		end.Done, end.AppliedIndex = err == nil, applied
		if err != nil {
			end.Error = err.Error()
		}
		return end
	})
}

// drawResponse is GET /v1/skus/{sku}/draw: what anyone needs to recompute
// the draw from the exported entries (docs/feed-and-lottery.md, "Lottery sales").
type drawResponse struct {
	SKU            string `json:"sku"`
	Entries        int64  `json:"entries"`
	Winners        int64  `json:"winners"`
	Promoted       int64  `json:"promoted"`
	SeedCommitment string `json:"seed_commitment"`
	Seed           string `json:"seed"`
	EntriesHash    string `json:"entries_hash"`
	ClosedAt       string `json:"closed_at"`
	DrawnAt        string `json:"drawn_at"`
	Algorithm      string `json:"algorithm"`
	AppliedIndex   uint64 `json:"applied_index"`
}

// drawAlgorithm names the draw's function, so a recomputation knows which
// one it checks.
const drawAlgorithm = "sha256(seed||entries_hash||be64(seq)) ascending, seq on ties; entries_hash chains sha256(h||be32(len(user))||user) from 32 zero bytes"

func (s *Server) handleDraw(ctx *fasthttp.RequestCtx, sku []byte) {
	v, ok, answered := s.saleCaughtUp(ctx, sku)
	if answered {
		return
	}
	if !ok || v.Row.Lottery == nil {
		writeError(ctx, fasthttp.StatusNotFound, "not_found", "no lottery with this sku")
		return
	}
	lt := v.Row.Lottery
	if !lt.Drawn() {
		writeError(ctx, fasthttp.StatusConflict, "not_drawn", "the draw comes after entries_close_at "+stamp(v.Row.Config.EntriesCloseAtUnixNano))
		return
	}
	writeJSON(ctx, fasthttp.StatusOK, drawResponse{
		SKU: v.Row.SKU, Entries: lt.Entries, Winners: lt.Winners, Promoted: lt.Promoted,
		SeedCommitment: hex.EncodeToString(lt.SeedCommitment), Seed: hex.EncodeToString(lt.Seed),
		EntriesHash: hex.EncodeToString(lt.EntriesHash), ClosedAt: stamp(v.Row.Config.EntriesCloseAtUnixNano),
		DrawnAt: stamp(lt.DrawnAtUnixNano), Algorithm: drawAlgorithm, AppliedIndex: v.Applied,
	})
}

package engine

import (
	"time"

	"stockd.dev/stockd/internal/queuetoken"
	"stockd.dev/stockd/raftfsm/waitroom"
	"stockd.dev/stockd/stock"
)

// admittedBy checks the waiting room's token of a deduct on queued sale s
// (any node, without a lookup: the keys are the ledger's, the MAC and the
// expiry in the token): true with the ticket's id in req when it admits
// req's user now; otherwise the refusal is in res. The ledger makes the
// token single-use when the take applies.
func (e *Engine) admittedBy(s *sale, req *DeductRequest, now *time.Time, res *DeductResult) bool {
	if len(req.AdmissionToken) == 0 {
		res.Status, res.Detail = StatusAdmissionRequired, "this sale sells to buyers its waiting room admitted: join its queue"
		e.metrics.countTokenRefused("missing")
		return false
	}
	tok, err := queuetoken.Parse(string(req.AdmissionToken))
	if err == nil {
		if now.IsZero() {
			*now = e.cfg.Now()
		}
		err = tok.Verify(*s.queueKeys.Load(), s.sku, string(req.User), now.UnixNano())
	}
	if err != nil {
		res.Status, res.Detail = StatusAdmissionInvalid, "admission token "+err.Error()
		e.metrics.countTokenRefused(queuetoken.Reason(err))
		return false
	}
	req.ticket = string(tok.TicketID[:])
	return true
}

// setQueueKeys takes a queued sale's verifying keys from its row.
func (s *sale) setQueueKeys(row *stock.SKU) {
	keys := waitroom.Keys(row)
	s.queueKeys.Store(&keys)
}

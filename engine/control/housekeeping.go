package control

import (
	"stockd.dev/stockd/raftfsm/command"
	"stockd.dev/stockd/stock"
	"time"
)

// The leader's housekeeping of the ledger (request ids' retention, the
// leases of nodes that left) and every node's periodic audit.

const (
	// pruneInterval paces the leader's request-id pruning by age.
	pruneInterval = 10 * time.Second
	// pruneOverCapInterval paces it while the ledger holds more ids than
	// RequestMaxKeep. A prune is one apply, which stalls every other for
	// its length: at 250,000 new ids a second (batch deducts) past the
	// cap, a prune every 10 s forgot 2.5 million ids in about a second;
	// every second it forgets a tenth as many, for the same work in all.
	pruneOverCapInterval = time.Second
)

// auditPaceFactor paces the periodic audit by its own cost: the next one
// starts no sooner than this many times the last one's duration after it,
// so the recount of every order takes at most a hundredth of a core
// however many orders the ledger holds (at ten million, a recount of a
// second or two runs every few minutes rather than every AuditInterval).
// A twentieth, as it was, showed as a tax on every request of a node
// holding millions of orders (`TestAuditGap_PacedByTheAuditsOwnCost`).
const auditPaceFactor = 100

// auditHoldRate and auditHoldMax hold the periodic audit back while a
// sale is on. A node answering more deducts and lottery entries a second
// than auditHoldRate is selling, and its audit's recount would take
// from the sale: at ten million orders it is a second or two of a core
// at once, and on two cores it halved a node's committed deducts while
// it ran (`scripts/bench-audit-sale.sh` shows it). The audit
// has no such hurry, so it waits for the rate to fall, up to
// auditHoldMax past its time (a node that sells without pause is still
// audited).
const (
	auditHoldRate = 1000
	auditHoldMax  = 5 * time.Minute
)

// sellingRate tells from the node's answered count whether it is busy
// selling: at least auditHoldRate answers a second over the last second
// or more.
type sellingRate struct {
	at       time.Time // when answered was read last
	answered uint64
	isBusy   bool
}

// reclaimLostNodes runs on the leader: it returns to available the leases
// of nodes that left the cluster, or that it has not reached for
// ReclaimAfter. Their later takes fail in the ledger, so nothing oversells.
func (p *Plane) reclaimLostNodes(now time.Time, tried map[string]time.Time) {
	c := p.cfg.Cluster
	if c == nil || !c.IsLeader() {
		return
	}
	holders := map[string]bool{}
	rows, _ := p.ledger.SKUs()
	for i := range rows {
		for node, units := range rows[i].Leased {
			if units > 0 && node != p.cfg.NodeID {
				holders[node] = true
			}
		}
	}
	if len(holders) == 0 {
		return
	}
	members, err := c.MemberIDs()
	if err != nil {
		return
	}
	isMember := map[string]bool{}
	for _, m := range members {
		isMember[m] = true
	}
	unreachable := c.Unreachable()
	for node := range holders {
		why := ""
		if !isMember[node] {
			why = "not a cluster member"
		} else if last, ok := unreachable[node]; ok && now.Sub(last) >= p.cfg.ReclaimAfter {
			why = "unreachable since " + last.UTC().Format(time.RFC3339)
		}
		if why == "" || now.Sub(tried[node]) < p.cfg.ReclaimAfter/2 {
			continue
		}
		tried[node] = now
		res, err := p.Engine.Propose(&command.Reclaim{Node: node})
		if err != nil {
			p.logger.Warn("reclaim failed", "node", node, "err", err)
			continue
		}
		p.logger.Warn("reclaimed leases", "node", node, "units", res.Qty, "reason", why)
	}
}

// overRequestCap reports whether the ledger holds more request ids than
// RequestMaxKeep (0: no cap).
func (p *Plane) overRequestCap() bool {
	return p.cfg.RequestMaxKeep > 0 && int64(p.ledger.RequestIDs()) > p.cfg.RequestMaxKeep
}

// pruneRequests runs on the leader: it bounds the request ids kept for
// idempotency by age and count.
func (p *Plane) pruneRequests(now time.Time) {
	if !p.Engine.IsLeader() || p.Engine.CommitBlocked() {
		return
	}
	before := now.Add(-p.cfg.RequestRetention).UnixNano()
	res, err := p.Engine.Propose(&command.PruneRequests{BeforeUnixNano: before, MaxKeep: p.cfg.RequestMaxKeep})
	if err != nil {
		p.logger.Warn("prune request ids", "err", err)
		return
	}
	if res.Qty > 0 {
		p.logger.Info("pruned request ids", "count", res.Qty)
	}
}

// auditDue reports whether the periodic audit starts now, sinceLast
// after the last one began: its gap has passed, and the node is not
// busy selling or has held it back for auditHoldMax already.
func auditDue(sinceLast, gap time.Duration, busy bool) bool {
	if sinceLast < gap {
		return false
	}
	return !busy || sinceLast >= gap+auditHoldMax
}

// busy takes the answered count at now and reports whether the node was
// busy over the last measured second.
func (r *sellingRate) busy(answered uint64, now time.Time) bool {
	if r.at.IsZero() {
		r.at, r.answered = now, answered
		return false
	}
	if elapsed := now.Sub(r.at); elapsed >= time.Second {
		r.isBusy = float64(answered-r.answered) >= auditHoldRate*elapsed.Seconds()
		r.at, r.answered = now, answered
	}
	return r.isBusy
}

// auditGap is the time between two periodic audits: AuditInterval, or
// longer when the last audit took long (auditPaceFactor).
func (p *Plane) auditGap() time.Duration {
	return auditGapAfter(p.cfg.AuditInterval, time.Duration(p.Engine.Metrics().AuditNanos()))
}

// auditGapAfter is the gap after an audit that took last: interval, or
// auditPaceFactor times last when that is longer.
func auditGapAfter(interval, last time.Duration) time.Duration {
	return max(interval, auditPaceFactor*last)
}

// auditAll checks every sale in the local ledger, in one pass over the
// orders, and records the drift.
func (p *Plane) auditAll() {
	audits, err := p.ledger.AuditAll()
	if err != nil {
		p.logger.Warn("periodic audit", "err", err)
		return
	}
	for sku, a := range audits {
		drift := auditDrift(&a)
		p.Engine.Metrics().SetDrift(sku, drift)
		if drift != 0 {
			p.logger.Error("audit found drift", "sku", sku, "drift_units", drift, "problem", a.Problem)
		}
	}
}

// auditDrift is how far an audit is from clean, in units: the conservation
// law's residual plus the gaps between the rows and the order recount.
func auditDrift(a *stock.Audit) int64 {
	r := &a.Row
	abs := func(v int64) int64 { return max(v, -v) }
	// An archived sale's sold orders left the ledger: they count by their
	// units (ArchivedSold), as the audit itself counts them.
	return abs(r.Total-r.Available-r.LeasedTotal()-r.Held-r.Sold) + abs(a.OrdersHeld-r.Held) + abs(a.OrdersSold+r.ArchivedSold-r.Sold)
}

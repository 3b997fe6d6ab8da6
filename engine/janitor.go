package engine

import (
	"errors"
	"time"

	"stockd/raftfsm"
	"stockd/raftfsm/command"
	"stockd/stock"
)

const (
	// expireBatchMax bounds one Expire command (each id ~20 bytes).
	expireBatchMax = 512
	// pruneInterval paces the leader's request-id pruning by age.
	pruneInterval = 10 * time.Second
	// pruneOverCapInterval paces it while the ledger holds more ids than
	// RequestMaxKeep. A prune is one apply, which stalls every other for
	// its length: at 250,000 new ids a second (batch deducts) past the
	// cap, a prune every 10 s forgot 2.5 million ids in about a second;
	// every second it forgets a tenth as many, for the same work in all.
	pruneOverCapInterval = time.Second
	// janitorTick paces the background checks: the commit breaker, idle
	// leases, reclaims and registration. Short enough that the breaker
	// follows an election within a tick.
	janitorTick = 50 * time.Millisecond
	// breakerFailures consecutive failed Take proposals open the breaker
	// for breakerCooldown; the next proposal after it tries again.
	breakerFailures = 3
	breakerCooldown = time.Second
)

// runJanitor runs the engine's periodic duties until Close.
func (e *Engine) runJanitor() {
	defer e.wg.Done()
	t := time.NewTicker(janitorTick)
	defer t.Stop()
	var lastSlow, lastPrune, lastAudit time.Time
	reclaimTried := map[string]time.Time{}
	var selling sellingRate
	var auditHeld time.Time // when a due audit was first held back; zero: none is
	for {
		select {
		case <-e.stop:
			return
		case <-t.C:
		}
		e.updateBreaker()
		now := e.cfg.Now()
		e.adaptive.update() // on the real clock, as the waits are
		e.pendingIDs.rotate(now)
		e.expireHolds(now)
		busy := selling.busy(e.metrics.answered(), time.Now()) // on the real clock, as the rate is
		gap := e.auditGap()
		if busy && auditHeld.IsZero() && now.Sub(lastAudit) >= gap {
			auditHeld = now
			e.logger.Info("periodic audit held back while the node sells", "answers_per_second_at_least", auditHoldRate, "at_most", auditHoldMax)
		}
		if auditDue(now.Sub(lastAudit), gap, busy) && e.auditing.CompareAndSwap(false, true) {
			if !auditHeld.IsZero() {
				e.logger.Info("periodic audit runs after being held back", "held", now.Sub(auditHeld).Round(time.Second), "still_selling", busy)
				auditHeld = time.Time{}
			}
			// An audit scans every order: off the janitor's goroutine, one
			// at a time, so the breaker and expiries keep their pace.
			lastAudit = now
			e.wg.Add(1)
			go func() {
				defer e.wg.Done()
				defer e.auditing.Store(false)
				start := time.Now()
				e.auditAll()
				e.metrics.auditNanos.Store(int64(time.Since(start)))
			}()
		}
		if since := now.Sub(lastPrune); since >= pruneInterval || since >= pruneOverCapInterval && e.overRequestCap() {
			lastPrune = now
			e.pruneRequests(now)
		}
		// Lease and membership duties need proposals; pace them slower.
		if now.Sub(lastSlow) < min(e.cfg.LeaseIdleReturn/4, 250*time.Millisecond) {
			continue
		}
		lastSlow = now
		e.registerSelf()
		e.upgradeRules()
		e.returnIdleLeases(now)
		e.reclaimLostNodes(now, reclaimTried)
	}
}

func (e *Engine) noteCommitFailure() {
	if e.consecutiveFailures.Add(1) >= breakerFailures {
		e.failOpenUntilNanos.Store(e.cfg.Now().Add(breakerCooldown).UnixNano())
	}
}

// updateBreaker blocks wait=commit deducts while raft cannot commit (no
// leader, or no contact with it) or after repeated failed proposals.
func (e *Engine) updateBreaker() {
	healthy := e.cfg.Cluster == nil || e.cfg.Cluster.CommitHealthy()
	failing := e.cfg.Now().UnixNano() < e.failOpenUntilNanos.Load()
	blocked := !healthy || failing
	if e.commitBlocked.Swap(blocked) != blocked {
		switch {
		case blocked && !e.breakerClosedOnce:
			e.logger.Info("commit breaker open until this node has a leader it can commit through: wait=commit deducts answer 503 meanwhile")
		case blocked:
			e.logger.Warn("commit breaker open: wait=commit deducts answer 503", "raft_healthy", healthy, "failing_proposals", failing)
		default:
			e.breakerClosedOnce = true
			e.logger.Info("commit breaker closed")
		}
	}
}

// registerSelf records this node's HTTP address in the ledger, so that
// followers can forward to it when it leads.
func (e *Engine) registerSelf() {
	if e.cfg.AdvertiseHTTP == "" || e.commitBlocked.Load() {
		return
	}
	if e.ledger.NodeAddrs()[e.cfg.NodeID] == e.cfg.AdvertiseHTTP {
		return
	}
	_, err := e.propose(&command.Register{Node: e.cfg.NodeID, Addr: e.cfg.AdvertiseHTTP})
	if err != nil {
		e.logger.Debug("register http address", "err", err)
		return
	}
	e.logger.Info("registered http address", "addr", e.cfg.AdvertiseHTTP)
}

// upgradeRules switches the ledger to this binary's rules once every
// voter runs a binary that knows them: the leader proposes SetRules, and
// from the next entry on every node applies the new rules (a cluster in
// the middle of a rolling upgrade keeps the old ones until its last node
// runs the new version). A new cluster switches on its first leader's
// first pass, before it has a sale to sell.
func (e *Engine) upgradeRules() {
	if e.ledger.Rules() >= raftfsm.RulesCurrent || e.commitBlocked.Load() {
		return
	}
	if c := e.cfg.Cluster; c != nil && (!c.IsLeader() || !c.VotersKnowRules(raftfsm.RulesCurrent)) {
		return
	}
	from := e.ledger.Rules()
	if _, err := e.propose(&command.SetRules{Rules: raftfsm.RulesCurrent}); err != nil {
		e.logger.Debug("switch ledger rules", "err", err)
		return
	}
	e.logger.Info("ledger rules switched", "from", from, "to", raftfsm.RulesCurrent)
}

// returnIdleLeases gives back the units of sales this node has not sold
// from for LeaseIdleReturn. It returns what the ledger says is leased here
// (less takes in flight) when that is more than the buckets held, so an
// idle sale also repairs a node-local law left broken by a lost update:
// after the Return the node holds nothing and the ledger agrees.
func (e *Engine) returnIdleLeases(now time.Time) {
	if e.commitBlocked.Load() {
		return
	}
	for _, s := range *e.sales.Load() {
		if now.UnixNano()-s.lastUseNanos.Load() < int64(e.cfg.LeaseIdleReturn) {
			continue
		}
		if e.ledger.AppliedIndex() < s.returnIndex.Load() {
			continue // the last Return is not applied here yet: its row is stale
		}
		row, _, ok := e.ledger.SKU(s.sku)
		if !ok {
			continue
		}
		leasedIdle := row.Leased[e.cfg.NodeID] - s.takesInFlight.Load()
		if s.buckets.Units() == 0 && leasedIdle <= 0 {
			continue
		}
		units := s.buckets.Drain()
		qty := max(units, leasedIdle)
		if qty <= 0 {
			continue
		}
		if units < leasedIdle {
			e.logger.Warn("buckets held less than the lease; returning the lease", "sku", s.sku, "buckets", units, "leased", leasedIdle)
		}
		res, err := e.propose(&command.Return{Node: e.cfg.NodeID, SKU: s.sku, Qty: qty})
		switch {
		case err == nil:
			s.returnIndex.Store(res.Index)
			e.metrics.leaseReturned.Add(uint64(res.Qty))
			e.logger.Debug("returned idle lease", "sku", s.sku, "units", res.Qty)
			if back := qty - res.Qty; back > 0 {
				// The ledger held less for us than the buckets did: the
				// buckets were ahead of it; keep the ledger's word.
				e.logger.Warn("buckets held more than the lease", "sku", s.sku, "excess", back)
			}
		case errors.Is(err, ErrOutcomeUnknown):
			// The Return may have applied: rebuild from the ledger later
			// rather than guess.
			e.logger.Warn("lease return outcome unknown; rebuilding buckets from the ledger", "sku", s.sku, "err", err)
			e.rebuildSale(s)
		default:
			// Nothing applied: the units are still ours.
			if units > 0 {
				s.buckets.Load(units)
			}
			s.stockChanged.broadcast()
		}
	}
}

// rebuildSale reloads one sale's buckets from leased[me] less the takes in
// flight.
func (e *Engine) rebuildSale(s *sale) {
	row, _, ok := e.ledger.SKU(s.sku)
	if !ok {
		return
	}
	s.buckets.Drain()
	if units := row.Leased[e.cfg.NodeID] - s.takesInFlight.Load(); units > 0 {
		s.buckets.Load(units)
	}
	s.stockChanged.broadcast()
}

// reclaimLostNodes runs on the leader: it returns to available the leases
// of nodes that left the cluster, or that it has not reached for
// ReclaimAfter. Their later takes fail in the ledger, so nothing oversells.
func (e *Engine) reclaimLostNodes(now time.Time, tried map[string]time.Time) {
	c := e.cfg.Cluster
	if c == nil || !c.IsLeader() {
		return
	}
	holders := map[string]bool{}
	rows, _ := e.ledger.SKUs()
	for i := range rows {
		for node, units := range rows[i].Leased {
			if units > 0 && node != e.cfg.NodeID {
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
		} else if last, ok := unreachable[node]; ok && now.Sub(last) >= e.cfg.ReclaimAfter {
			why = "unreachable since " + last.UTC().Format(time.RFC3339)
		}
		if why == "" || now.Sub(tried[node]) < e.cfg.ReclaimAfter/2 {
			continue
		}
		tried[node] = now
		res, err := e.propose(&command.Reclaim{Node: node})
		if err != nil {
			e.logger.Warn("reclaim failed", "node", node, "err", err)
			continue
		}
		e.logger.Warn("reclaimed leases", "node", node, "units", res.Qty, "reason", why)
	}
}

func (e *Engine) isLeader() bool { return e.cfg.Cluster == nil || e.cfg.Cluster.IsLeader() }

// expireHolds runs on the leader: it proposes the release of holds past
// their deadline, a bounded batch per tick. Followers never expire on their
// own clocks; a new leader finds the same holds in its ledger.
func (e *Engine) expireHolds(now time.Time) {
	if !e.isLeader() || e.commitBlocked.Load() {
		return
	}
	due := e.ledger.ExpiredHolds(now.UnixNano(), expireBatchMax)
	if len(due) == 0 {
		return
	}
	res, err := e.propose(&command.Expire{OrderIDs: due})
	if err != nil {
		e.logger.Warn("expire holds", "orders", len(due), "err", err)
		return
	}
	e.metrics.holdsExpired.Add(uint64(res.Qty))
	e.logger.Debug("expired holds", "orders", len(due), "units", res.Qty)
}

// overRequestCap reports whether the ledger holds more request ids than
// RequestMaxKeep (0: no cap).
func (e *Engine) overRequestCap() bool {
	return e.cfg.RequestMaxKeep > 0 && int64(e.ledger.RequestIDs()) > e.cfg.RequestMaxKeep
}

// pruneRequests runs on the leader: it bounds the request ids kept for
// idempotency by age and count.
func (e *Engine) pruneRequests(now time.Time) {
	if !e.isLeader() || e.commitBlocked.Load() {
		return
	}
	before := now.Add(-e.cfg.RequestRetention).UnixNano()
	res, err := e.propose(&command.PruneRequests{BeforeUnixNano: before, MaxKeep: e.cfg.RequestMaxKeep})
	if err != nil {
		e.logger.Warn("prune request ids", "err", err)
		return
	}
	if res.Qty > 0 {
		e.logger.Info("pruned request ids", "count", res.Qty)
	}
}

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

// auditDue reports whether the periodic audit starts now, sinceLast
// after the last one began: its gap has passed, and the node is not
// busy selling or has held it back for auditHoldMax already.
func auditDue(sinceLast, gap time.Duration, busy bool) bool {
	if sinceLast < gap {
		return false
	}
	return !busy || sinceLast >= gap+auditHoldMax
}

// sellingRate tells from the node's answered count whether it is busy
// selling: at least auditHoldRate answers a second over the last second
// or more.
type sellingRate struct {
	at       time.Time // when answered was read last
	answered uint64
	isBusy   bool
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
func (e *Engine) auditGap() time.Duration {
	return max(e.cfg.AuditInterval, auditPaceFactor*time.Duration(e.metrics.auditNanos.Load()))
}

// auditAll checks every sale in the local ledger, in one pass over the
// orders, and records the drift.
func (e *Engine) auditAll() {
	audits, err := e.ledger.AuditAll()
	if err != nil {
		e.logger.Warn("periodic audit", "err", err)
		return
	}
	for sku, a := range audits {
		drift := auditDrift(&a)
		e.metrics.setDrift(sku, drift)
		if drift != 0 {
			e.logger.Error("audit found drift", "sku", sku, "drift_units", drift, "problem", a.Problem)
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

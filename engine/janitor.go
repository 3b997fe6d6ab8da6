package engine

import (
	"errors"
	"time"

	"stockd.dev/stockd/raftfsm"
	"stockd.dev/stockd/raftfsm/command"
)

const (
	// expireBatchMax bounds one Expire command (each id ~20 bytes).
	expireBatchMax = 512
	// janitorTick paces the background checks: the commit breaker, idle
	// leases, expiries and registration. Short enough that the breaker
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
	var lastSlow time.Time
	for {
		select {
		case <-e.stop:
			return
		case <-t.C:
		}
		e.updateBreaker()
		now := e.cfg.Now()
		e.adaptive.Update() // on the real clock, as the waits are
		e.pendingIDs.Rotate(now)
		e.expireHolds(now)
		// Lease and membership duties need proposals; pace them slower.
		if now.Sub(lastSlow) < min(e.cfg.LeaseIdleReturn/4, 250*time.Millisecond) {
			continue
		}
		lastSlow = now
		e.registerSelf()
		e.upgradeRules()
		e.returnIdleLeases(now)
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

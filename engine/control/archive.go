package control

import (
	"time"

	"stockd.dev/stockd/raftfsm"
	"stockd.dev/stockd/raftfsm/command"
	"stockd.dev/stockd/stock"
)

// A purge step is one raft entry every node applies, so it stays short
// (tens of milliseconds) and the sale's other traffic goes on between
// steps: purgeStep order records (or lottery entries) read, at most
// command.PurgeOrdersMax orders named.
const purgeStep = 20_000

// purgeCheck paces the purger's look for archived sales with orders left
// (after a leader change, say); an archive wakes it at once.
const purgeCheck = time.Second

func (p *Plane) wakePurge() {
	select {
	case p.purgeWake <- struct{}{}:
	default:
	}
}

// runPurger is the leader's side of archiving: it proposes PurgeArchived
// steps for every archived sale until its orders are gone.
func (p *Plane) runPurger() {
	defer p.wg.Done()
	t := time.NewTicker(purgeCheck)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		case <-p.purgeWake:
		}
		if !p.Engine.IsLeader() || p.Engine.CommitBlocked() {
			continue
		}
		rows, _ := p.ledger.SKUs()
		for i := range rows {
			if rows[i].Archived && !rows[i].PurgeDone {
				p.purge(rows[i].SKU)
			}
		}
	}
}

// purge proposes steps for one archived sale until it is done, an error
// (the next check goes on from where the ledger says), or a stop. Each
// step names the orders it removes, read from this node's file after
// where its last read stopped (a place in this file only, kept here).
func (p *Plane) purge(sku string) {
	if p.ledger.Rules() < raftfsm.RulesNamedPurges {
		// Not every node runs a version whose steps name their orders
		// yet: the orders wait (the rules switch once every voter does).
		return
	}
	started, removed := time.Now(), int64(0)
	var after []byte
	for {
		select {
		case <-p.stop:
			return
		default:
		}
		row, _, ok := p.ledger.SKU(sku)
		if !ok || !row.Archived || row.PurgeDone {
			if ok {
				p.logger.Info("archived sale's orders are out of the ledger", "sku", sku, "orders", row.ArchivedOrders,
					"this_run", removed, "took", time.Since(started).Round(time.Millisecond))
			}
			return
		}
		ids, next, done, err := p.ledger.ArchivedOrderIDs(sku, after, command.PurgeOrdersMax, purgeStep)
		if err != nil {
			p.logger.Error("archive step: reading the sale's orders failed", "sku", sku, "err", err)
			return
		}
		step := &command.PurgeOrders{SKU: sku, IDs: ids, OrdersDone: done}
		if done {
			step.Entries = purgeStep
		}
		res, err := p.Engine.Propose(step)
		if err != nil {
			p.logger.Warn("archive step not committed; trying again later", "sku", sku, "err", err)
			return
		}
		if res.Outcome != stock.OutcomeOK && res.Outcome != stock.OutcomeSame {
			p.logger.Error("archive step refused", "sku", sku, "outcome", res.Outcome.String(), "detail", res.Detail)
			return
		}
		removed, after = removed+res.Qty, next
		if p.cfg.Cluster == nil {
			continue // a node alone has applied its own step
		}
		if !p.cfg.Cluster.IsLeader() {
			return
		}
		// The next read must see this step applied here.
		if err := p.ledger.WaitApplied(p.stopped, res.Index); err != nil {
			return
		}
	}
}

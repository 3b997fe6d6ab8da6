package raftfsm

// HaltPersister stops l's persister and makes Close skip the last flush:
// from here on nothing reaches ledger.db, as if the process died after
// each commit. For raftfsm_test's crash test, which needs a raft node.
func HaltPersister(l *Ledger) {
	l.bh.Halt()
	l.test.noFinalWrite = true
}

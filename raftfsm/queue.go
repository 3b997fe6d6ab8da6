package raftfsm

import "stockd.dev/stockd/raftfsm/waitroom"

// queueTxn is the applier as the waiting room's apply sees it.
type queueTxn struct{ *applier }

func (t queueTxn) Get(bucket, key []byte) ([]byte, error) { return t.get(bucket, key) }
func (t queueTxn) Put(bucket, key, value []byte)          { t.put(bucket, key, value) }
func (t queueTxn) At() int64                              { return t.at }

// QueueRecords reads the waiting room's records as this node's ledger
// holds them (pending changes, then the file), for waitroom's reads. A
// ticket's record may be read a moment before its sale's row counts it.
func (l *Ledger) QueueRecords() waitroom.Reader { return ledgerReader{l} }

type ledgerReader struct{ *Ledger }

func (r ledgerReader) Get(bucket, key []byte) ([]byte, error) { return r.read(bucket, key) }

package node

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"stockd.dev/stockd/peer"
	"stockd.dev/stockd/raftfsm"
	"stockd.dev/stockd/raftnode"
)

const (
	// joinAttemptsTimeout bounds how long -join keeps asking the cluster.
	joinAttemptsTimeout = time.Minute
	// joinCallTimeout bounds one join request.
	joinCallTimeout = 10 * time.Second
	// joinRetryPause spaces join requests the cluster could not take yet.
	joinRetryPause = time.Second
)

// joinCluster asks a running cluster (through any member's HTTP URL) to
// add this node as a voter, unless it already is one.
func joinCluster(cfg Config, raftAddr string, tlsCfg *tls.Config, voters []raftnode.Peer, ledger *raftfsm.Ledger, logger *slog.Logger) error {
	for _, v := range voters {
		if v.ID == cfg.ID {
			return nil // restarted on its data dir: already a member
		}
	}
	// The joiner's cluster and index: a node holding another cluster's
	// state is refused (a fresh one has neither).
	body, _ := json.Marshal(map[string]any{"id": cfg.ID, "raft_addr": raftAddr, "cluster": ledger.ClusterID(), "applied_index": ledger.AppliedIndex()})
	base := strings.TrimRight(cfg.Join, "/")
	deadline := time.Now().Add(joinAttemptsTimeout)
	for {
		code, answer, err := peer.Join(base, body, cfg.HTTP.AdminToken, cfg.ClusterSecret, tlsCfg, joinCallTimeout)
		if err == nil && code == 200 {
			logger.Info("joined cluster", "via", cfg.Join)
			return nil
		}
		if err == nil && code >= 400 && code < 500 {
			return fmt.Errorf("join through %s: %d %s", cfg.Join, code, answer)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("join through %s: gave up after %s (last: %d %s %v)", cfg.Join, joinAttemptsTimeout, code, answer, err)
		}
		logger.Warn("join not accepted yet; retrying", "via", cfg.Join, "code", code, "err", err)
		time.Sleep(joinRetryPause)
	}
}

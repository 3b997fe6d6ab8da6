package backup

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"stockd.dev/stockd/raftfsm/store"
	"strings"
)

// Restore runs `stockd restore -from FILE -data DIR -id ID [-peers ...]`:
// it builds a data dir from which a new cluster starts holding exactly the
// backup's state, or refuses, leaving nothing behind.
func Restore(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("stockd restore", flag.ContinueOnError)
	fs.SetOutput(stderr)
	from := fs.String("from", "", "the backup file (required)")
	dataDir := fs.String("data", "", "the data dir to build (required; created if missing, refused if not empty)")
	id := fs.String("id", "", "the id of the node that will serve the dir (required; serve refuses another)")
	peers := fs.String("peers", "", "the new cluster's voters, id=raft_addr,... (run restore once per node with the same list; empty: a single node at its first serve's -raft address)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: stockd restore -from FILE -data DIR -id ID [-peers id=addr,...]\n\nBuilds a data dir that starts a new cluster holding exactly the backup's state.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case *from == "":
		return errors.New("-from is required: the backup file to restore")
	case *dataDir == "":
		return errors.New("-data is required: the data dir to build")
	case *id == "":
		return errors.New("-id is required: the node that will serve the data dir")
	}
	voters, err := parsePeers(*peers, *id)
	if err != nil {
		return err
	}
	created, err := emptyDir(*dataDir)
	if err != nil {
		return err
	}
	info, h, err := restoreInto(*from, *dataDir, *id, voters)
	if err != nil {
		if created {
			os.RemoveAll(*dataDir)
		} else {
			for _, f := range []string{"ledger.db", ".ledger.db.restoring", store.RestoreMarkerFile} {
				os.Remove(filepath.Join(*dataDir, f))
			}
		}
		return err
	}
	fmt.Fprintf(stdout, "%s: node %s of cluster %s, the ledger of %s at log index %d (%d SKUs, %d leased units back to available); the new cluster's log starts at %d\n",
		*dataDir, *id, info.ClusterID, h.Node, h.AppliedIndex, info.SKUs, info.UnitsUnleased, info.At)
	fmt.Fprintf(stdout, "start it: stockd serve -id %s -data %s ...\n", *id, *dataDir)
	return nil
}

// restoreInto checks the backup, puts its ledger in dir prepared for a new
// cluster, and writes the restore marker.
func restoreInto(from, dir, id string, voters []store.RestorePeer) (store.RestoreInfo, store.BackupHeader, error) {
	tmp := filepath.Join(dir, ".ledger.db.restoring")
	h, err := store.ExtractBackup(from, tmp)
	if err != nil {
		return store.RestoreInfo{}, h, fmt.Errorf("%s: %w", from, err)
	}
	info, err := store.PrepareRestore(tmp, h.AppliedIndex, store.ClusterIDFor(h.Checksum, id, voters))
	if err != nil {
		return info, h, fmt.Errorf("prepare the restored ledger: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "ledger.db")); err != nil {
		return info, h, err
	}
	m := store.RestoreMarker{NodeID: id, Index: info.At, From: info.From, Peers: voters}
	if err := store.WriteRestoreMarker(dir, m); err != nil {
		return info, h, fmt.Errorf("write the restore marker: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return info, h, nil
}

// emptyDir makes sure dir exists and is empty; created says it made it.
func emptyDir(dir string) (created bool, err error) {
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return false, err
		}
		return true, nil
	case err != nil:
		return false, err
	case len(entries) > 0:
		return false, fmt.Errorf("%s is not empty (%s, ...): restore builds a new data dir and never writes over one", dir, entries[0].Name())
	}
	return false, nil
}

// parsePeers reads -peers; the list must name id.
func parsePeers(s, id string) ([]store.RestorePeer, error) {
	if s == "" {
		return nil, nil
	}
	var out []store.RestorePeer
	self := false
	for _, p := range strings.Split(s, ",") {
		pid, addr, ok := strings.Cut(strings.TrimSpace(p), "=")
		if !ok || pid == "" || addr == "" {
			return nil, fmt.Errorf("-peers: %q is not id=raft_addr", p)
		}
		self = self || pid == id
		out = append(out, store.RestorePeer{ID: pid, Addr: addr})
	}
	if !self {
		return nil, fmt.Errorf("-peers does not name -id %s", id)
	}
	return out, nil
}

// Package layout holds the tests of the project's shape: which package may
// import which, and how large a file or a function may grow. They read
// the module with go list and go/parser; nothing here is built into
// stockd.
package layout

import (
	"bytes"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "stockd.dev/stockd"

// allowed says which of the module's packages each may import (its own
// packages below it and the leaf helpers under internal/ aside). The
// arrows point one way: main -> node -> httpapi -> engine -> {shard,
// raftfsm}; node may also import engine, raftfsm and raftnode (the raft
// node's wiring, which imports raftfsm); no production
// package but main imports node; client (a module of its own, importable
// anywhere), feed and sink talk HTTP; backup talks
// HTTP and reads backup files with raftfsm; bench may
// import shard and engine for its in-process strategies; shard and raftfsm
// import nothing of ours but what they own.
var allowed = map[string][]string{
	"stockd.dev/stockd":      {"node", "bench", "feed", "backup", "sink"},
	"stockd.dev/stockd/node": {"httpapi", "peer", "engine", "raftfsm", "raftnode", "stock"},
	// The node-to-node wire, both ends: it speaks HTTP and knows none of
	// the public contract (httpapi reaches it through httpapi.Peers).
	"stockd.dev/stockd/peer":     {},
	"stockd.dev/stockd/raftnode": {"raftfsm", "stock"},
	"stockd.dev/stockd/httpapi":  {"engine", "stock"},
	"stockd.dev/stockd/engine":   {"shard", "raftfsm", "stock"},
	"stockd.dev/stockd/shard":    {},
	"stockd.dev/stockd/raftfsm":  {"stock"},
	// The domain types every layer speaks (a sale's row, orders, outcomes,
	// entries, feed events, cursors): a leaf.
	"stockd.dev/stockd/stock":  {},
	"stockd.dev/stockd/client": {},
	"stockd.dev/stockd/feed":   {},
	// stockd sink and stockd reconcile: the feed over HTTP (through the
	// client) into the shop's database.
	"stockd.dev/stockd/sink": {},
	// stockd backup: fetches over HTTP, reads and checks the file with
	// the ledger's own code.
	"stockd.dev/stockd/backup": {"raftfsm", "stock"},
	"stockd.dev/stockd/bench":  {"shard", "engine", "stock"},
	// The scenario tests (clusters, faults, crowds, the contract's
	// conformance): test files only, so no arrows of their own.
	"stockd.dev/stockd/scenario": {},
}

// apart are packages under one top-level package that must not import
// each other, though a package's own subpackages may otherwise: the two
// HTTP doors (the handlers, the event loop) share deductwire's one reading
// of a deduct and neither reaches into the other; node wires them.
var apart = map[string][]string{
	"stockd.dev/stockd/httpapi":            {"stockd.dev/stockd/httpapi/eventloop"},
	"stockd.dev/stockd/httpapi/eventloop":  {"stockd.dev/stockd/httpapi"},
	"stockd.dev/stockd/httpapi/deductwire": {"stockd.dev/stockd/httpapi", "stockd.dev/stockd/httpapi/eventloop"},
}

// harness is the multi-node test harness, beside node: only tests import
// it, and it is the one package besides main that imports node.
const harness = "stockd.dev/stockd/node/nodetest"

// clientModule is the Go client, a module of its own on the standard
// library alone: any package may import it as it would a library
// (TestClientModule_AServiceGetsTheClientAlone checks it stays alone).
const clientModule = module + "/client"

type pkg struct {
	ImportPath   string
	Dir          string
	GoFiles      []string
	Imports      []string
	TestImports  []string
	XTestImports []string
}

func listPackages(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", module+"/...")
	cmd.Dir = moduleRoot(t)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(&out)
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 8 {
		t.Fatalf("go list found %d packages", len(pkgs))
	}
	return pkgs
}

func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		t.Fatalf("no go.mod at %s", dir)
	}
	return dir
}

// top is the top-level package a package of the module belongs to
// (stockd/raftfsm/command: stockd/raftfsm).
func top(path string) string {
	rest, ok := strings.CutPrefix(path, module+"/")
	if !ok {
		return path
	}
	first, _, _ := strings.Cut(rest, "/")
	return module + "/" + first
}

// mayImport reports whether package from may import package to, both of
// the module.
func mayImport(from, to string) bool {
	switch {
	case to == harness || strings.HasPrefix(to, harness+"/"):
		return false // tests only
	case to == clientModule || strings.HasPrefix(to, clientModule+"/"):
		return true // a library of its own
	case strings.HasPrefix(to, module+"/internal/"):
		return true // leaf helpers; TestLayout_InternalHelpersAreLeaves checks them
	case slices.Contains(apart[from], to):
		return false
	case from != module && top(from) == top(to):
		return true // a package's own subpackages
	}
	name := strings.TrimPrefix(top(to), module+"/")
	if to == module {
		name = module
	}
	return slices.Contains(allowed[top(from)], name)
}

func TestLayout_ImportsFollowTheArrows(t *testing.T) {
	for _, p := range listPackages(t) {
		if strings.HasPrefix(p.ImportPath, module+"/internal/") {
			continue
		}
		if _, known := allowed[top(p.ImportPath)]; !known {
			t.Errorf("package %s is not in the layout: add it to allowed (and to docs/architecture.md)", p.ImportPath)
			continue
		}
		for _, imp := range p.Imports {
			if (imp == module || strings.HasPrefix(imp, module+"/")) && !mayImport(p.ImportPath, imp) {
				t.Errorf("%s imports %s, which the layout forbids", p.ImportPath, imp)
			}
		}
	}
}

// TestLayout_InternalHelpersAreLeaves: a helper under internal/ imports
// nothing of ours but other helpers, so any package may use it without
// bending the arrows; the test harness may import anything, and only
// tests import it.
func TestLayout_InternalHelpersAreLeaves(t *testing.T) {
	for _, p := range listPackages(t) {
		if !strings.HasPrefix(p.ImportPath, module+"/internal/") || p.ImportPath == harness || strings.HasPrefix(p.ImportPath, module+"/internal/layout") {
			continue
		}
		for _, imp := range p.Imports {
			if strings.HasPrefix(imp, module+"/") && !strings.HasPrefix(imp, module+"/internal/") && !mayImport(p.ImportPath, imp) {
				t.Errorf("helper %s imports %s", p.ImportPath, imp)
			}
		}
	}
}

// Size limits: a file a reader can hold, a function one screen or two,
// shorter on the deduct path (which a newcomer follows first).
const (
	fileLinesMax       = 600
	funcLinesMax       = 100
	deductFuncLinesMax = 70
)

// deductPath are the files a deduct runs through, handler to fsync.
var deductPath = []string{
	"httpapi/deduct.go", "httpapi/batch.go", "engine/deduct.go", "engine/deduct_batch.go", "engine/pending.go",
	"engine/committer.go", "internal/batcher/batcher.go", "engine/admission/admission.go", "internal/pendingfilter/pendingfilter.go", "shard/shard.go", "node/proposer.go",
	"raftfsm/apply_orders.go", "raftfsm/apply.go",
	"engine/deduct_async.go", "httpapi/eventloop/loop_linux.go", "httpapi/eventloop/parse_linux.go",
	"httpapi/deductwire/read.go", "httpapi/deductwire/body.go", "httpapi/deductwire/answer.go",
}

func TestLayout_FilesAndFunctionsStayReadable(t *testing.T) {
	root := moduleRoot(t)
	for _, p := range listPackages(t) {
		for _, name := range p.GoFiles {
			path := filepath.Join(p.Dir, name)
			rel, _ := filepath.Rel(root, path)
			src, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if n := bytes.Count(src, []byte("\n")); n > fileLinesMax {
				t.Errorf("%s: %d lines, the most is %d", rel, n, fileLinesMax)
			}
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, path, src, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			limit := funcLinesMax
			if slices.Contains(deductPath, filepath.ToSlash(rel)) {
				limit = deductFuncLinesMax
			}
			for _, d := range f.Decls {
				fn, ok := d.(*ast.FuncDecl)
				if !ok || fn.Body == nil {
					continue
				}
				lines := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1
				if lines > limit {
					t.Errorf("%s: func %s is %d lines, the most is %d", rel, funcName(fn), lines, limit)
				}
			}
		}
	}
}

func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	var b strings.Builder
	switch r := fn.Recv.List[0].Type.(type) {
	case *ast.StarExpr:
		if id, ok := r.X.(*ast.Ident); ok {
			b.WriteString("(*" + id.Name + ").")
		}
	case *ast.Ident:
		b.WriteString(r.Name + ".")
	}
	return b.String() + fn.Name.Name
}

// TestLayout_TheRulesRefuseWhatTheArrowsForbid checks the checker: pairs
// the layout must refuse and pairs it must allow.
func TestLayout_TheRulesRefuseWhatTheArrowsForbid(t *testing.T) {
	for _, c := range []struct {
		from, to string
		ok       bool
	}{
		{"stockd.dev/stockd/engine", "stockd.dev/stockd/httpapi", false},
		{"stockd.dev/stockd/raftfsm", "stockd.dev/stockd/engine", false},
		{"stockd.dev/stockd/shard", "stockd.dev/stockd/raftfsm", false},
		{"stockd.dev/stockd/httpapi", "stockd.dev/stockd/node", false},
		{"stockd.dev/stockd/httpapi", "stockd.dev/stockd/raftfsm", false},
		{"stockd.dev/stockd/client", "stockd.dev/stockd/engine", false},
		{"stockd.dev/stockd/feed", "stockd.dev/stockd/httpapi", false},
		{"stockd.dev/stockd/bench", "stockd.dev/stockd/node", false},
		{"stockd.dev/stockd/engine", harness, false},
		{"stockd.dev/stockd/node", "stockd.dev/stockd/httpapi", true},
		{"stockd.dev/stockd/node", "stockd.dev/stockd/raftfsm", true},
		{"stockd.dev/stockd/engine", "stockd.dev/stockd/raftfsm", true},
		{"stockd.dev/stockd/raftfsm", "stockd.dev/stockd/internal/hashfilter", true},
		{module, "stockd.dev/stockd/node", true},
		{module, "stockd.dev/stockd/raftfsm", false},
		{"stockd.dev/stockd/engine", "stockd.dev/stockd/raftnode", false},
		{"stockd.dev/stockd/raftfsm", "stockd.dev/stockd/raftnode", false},
		{"stockd.dev/stockd/raftnode", "stockd.dev/stockd/raftfsm", true},
		{"stockd.dev/stockd/httpapi", "stockd.dev/stockd/httpapi/eventloop", false},
		{"stockd.dev/stockd/httpapi/eventloop", "stockd.dev/stockd/httpapi", false},
		{"stockd.dev/stockd/httpapi/eventloop", "stockd.dev/stockd/httpapi/deductwire", true},
		{"stockd.dev/stockd/httpapi", "stockd.dev/stockd/httpapi/deductwire", true},
		{"stockd.dev/stockd/node", "stockd.dev/stockd/httpapi/eventloop", true},
		{"stockd.dev/stockd/node", "stockd.dev/stockd/peer", true},
		{"stockd.dev/stockd/httpapi", "stockd.dev/stockd/peer", false},
		{"stockd.dev/stockd/peer", "stockd.dev/stockd/httpapi", false},
		{"stockd.dev/stockd/peer", "stockd.dev/stockd/node", false},
		{"stockd.dev/stockd/engine", "stockd.dev/stockd/peer", false},
		{"stockd.dev/stockd/internal/health", clientModule, true},
		{"stockd.dev/stockd/internal/health", "stockd.dev/stockd/stock", false},
		{harness, "stockd.dev/stockd/node", true},
		{harness, "stockd.dev/stockd/raftnode", true},
		{harness, "stockd.dev/stockd/scenario", false},
		{harness, "stockd.dev/stockd/bench", false},
		{"stockd.dev/stockd/scenario", "stockd.dev/stockd/node", false},
	} {
		if got := mayImport(c.from, c.to); got != c.ok {
			t.Errorf("%s -> %s: allowed %v, want %v", c.from, c.to, got, c.ok)
		}
	}
}

// TestLayout_OnlyMainAndTheHarnessImportNode: node wires the whole
// process; what it builds is reached through main (the binary) or the
// harness (tests), never by a package it imports or a sibling.
func TestLayout_OnlyMainAndTheHarnessImportNode(t *testing.T) {
	const node = module + "/node"
	for _, p := range listPackages(t) {
		if p.ImportPath == module || p.ImportPath == harness || p.ImportPath == node {
			continue
		}
		if slices.Contains(p.Imports, node) {
			t.Errorf("%s imports %s: only main and the harness (%s) may", p.ImportPath, node, harness)
		}
	}
}

// packageLinesMax bounds a package's non-test lines: a room one engineer
// can hold in mind.
const packageLinesMax = 4000

func TestLayout_PackagesStaySmall(t *testing.T) {
	for _, p := range listPackages(t) {
		lines := 0
		for _, name := range p.GoFiles {
			src, err := os.ReadFile(filepath.Join(p.Dir, name))
			if err != nil {
				t.Fatal(err)
			}
			lines += bytes.Count(src, []byte("\n"))
		}
		if lines > packageLinesMax {
			t.Errorf("%s: %d lines outside its tests, the most is %d: split it along a seam", p.ImportPath, lines, packageLinesMax)
		}
	}
}

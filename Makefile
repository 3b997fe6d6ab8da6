# stockd: a flash-sale stock engine. `make run` and `make test` are all a
# newcomer needs; both work on a fresh machine with only Go installed.

GO      ?= go
BIN     ?= bin/stockd
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)

.PHONY: image ui-screenshot queue-screenshots bench-screenshot build run test test-multiproc test-crowd test-memory test-nemesis test-sink soak vet lint bench bench-peers bench-go clean cluster cluster-stop

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) .

# The container image (deploy/Dockerfile): the static binary FROM scratch,
# a non-root user, /data as a volume, a health check through stockd health.
IMAGE ?= stockd:$(VERSION)
image:
	rm -rf deploy/context && mkdir -p deploy/context/data
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o deploy/context/stockd .
	docker build -f deploy/Dockerfile -t $(IMAGE) deploy/context
	@echo "image: $(IMAGE)"

# One node on 127.0.0.1:8080 (raft on 127.0.0.1:7000), data in ./data;
# the operator's page at http://127.0.0.1:8080/ui.
run: build
	$(BIN) serve

# The whole suite with the race detector, vet first: about 10 minutes on
# two cores, a line per package as it finishes (gotestsum, fetched through
# the module proxy on first use; a failure's output follows the list).
# Allocation tests run without -race first (the race detector changes
# allocation counts), then everything with it.
GOTESTSUM ?= $(GO) run gotest.tools/gotestsum@v1.13.0
test: vet
	$(GO) test -count=1 -run Allocate ./httpapi/ ./engine/ ./shard/
	$(GOTESTSUM) --format pkgname -- -race -count=1 -timeout 15m ./...
	cd client && $(GOTESTSUM) --format pkgname -- -race -count=1 ./...

# staticcheck, fetched through the module proxy on first use; and the
# binary built for Windows and macOS, so that a Linux-only call outside a
# build-tagged file is caught here (the tests themselves are Linux's).
lint:
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
	cd client && $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
	GOOS=windows GOARCH=amd64 $(GO) build -o /dev/null .
	GOOS=darwin GOARCH=arm64 $(GO) build -o /dev/null .

# Three stockd processes on loopback; the leader is killed with SIGKILL
# mid-sale and restarted on its data dir. Then a rolling upgrade from the
# version before ledger rules (built from the repository's history),
# buyers through the Go client (one cluster, then two through
# client.NewSharded) while a leader is killed, and the TLS tests: the
# leader kill on certificates made by stockd cert, refusals at the node
# port (openssl needed), certificates rotated with SIGHUP under load, and
# three hosts in network namespaces (root and iproute2 needed; skipped
# without, saying why); and stockd backup mid-sale from a follower and the
# leader, each restored with stockd restore into a fresh three-process
# cluster that sells the rest. And answers that stay true: a write through
# one node and the next call on another at once, 50 times for each kind
# of write; 100 fresh clusters used the instant they are ready; batches
# of 1,000 buyers over 300 units won by exactly the first 300. And a
# queued sale of 10,000 units for 100,000 users who join twice at once,
# the leader killed in the middle of admission (about a minute).
test-multiproc:
	STOCKD_MULTIPROC=1 $(GO) test -count=1 -v -timeout 20m -run 'MultiProcess_(Leader|RollingUpgrade|Client|Sharded|TLS|BackupRestore|AnswersStayTrue|FreshCluster|BatchJudged|Queue)' ./scenario

# The order feed into a real PostgreSQL and a real MariaDB (started by the
# test from Debian's packages, each in its own directory): three stockd
# processes sell 20,000 deducts over 50 sales with holds; the sink is
# SIGKILLed five times (once between a commit and its acknowledgement), the
# leader once, the database stopped hard once; reconcile must agree and an
# audit trigger must have seen each order inserted once; and the sink and
# reconcile on HTTPS nodes that require client certificates (about 3 minutes).
test-sink:
	STOCKD_MULTIPROC=1 $(GO) test -count=1 -v -timeout 15m -run 'MultiProcess_Sink' ./scenario

# One node filled with a million sold orders and their request ids; fails
# when its peak resident memory (VmHWM) passes 384 MiB.
test-memory:
	STOCKD_MEMORY=1 $(GO) test -count=1 -v -timeout 15m -run Memory_ ./scenario

# A sale at the size of a real one: three stockd processes, 1,200 client
# connections over them, 36,000 buyers for 30,000 units, 4 % of request ids
# sent to two nodes at once, then SIGTERM to all three under the drain limit.
test-crowd:
	STOCKD_CROWD=1 $(GO) test -count=1 -v -timeout 10m -run MultiProcess_Crowd ./scenario

# Seeded random fault schedules against an in-process cluster (the
# ledger's invariants and a linearizability check after each): 20 over
# three nodes and 5 over five. A failure prints its seed and the command that replays
# it. `make test` runs 2 of them. NEMESIS=32,8 (make's variable, or the
# environment's, so `NEMESIS=32,8 bash .ci/run` works) runs another count.
NEMESIS ?= 20,5
test-nemesis:
	STOCKD_NEMESIS=$(NEMESIS) $(GO) test -count=1 -v -timeout 15m -run 'Nemesis' ./scenario | scripts/nemesis-summary.sh

# Many more schedules, four in five over three nodes, the rest over five:
# make soak SEEDS=500. Prints each failing schedule's replay command and a
# summary (schedules, faults injected, deducts, violations); the whole
# output goes to soak.log. A run that hangs ends at a minute per schedule
# with every goroutine's stack.
SEEDS ?= 100
soak:
	STOCKD_NEMESIS=$$(( $(SEEDS) - $(SEEDS) / 5 )),$$(( $(SEEDS) / 5 )) $(GO) test -count=1 -v -timeout $$(( $(SEEDS) * 60 ))s -run 'Nemesis$$' ./scenario | NEMESIS_LOG=soak.log scripts/nemesis-summary.sh

# The client (client/) is a module of its own: vetted, linted and tested
# from its own directory, against the oldest Go its go.mod declares.
vet:
	$(GO) vet ./...
	cd client && $(GO) vet ./...
	@test -z "$$(gofmt -l .)" || { echo "gofmt would change:"; gofmt -l .; exit 1; }

# A flash sale against a freshly launched local node: 1,000 units,
# 100,000 buyers, 64 connections; prints throughput, latency, outcomes and
# the oversell check, what each column means, and where it wrote the HTML
# report (BENCH_HTML: tables and charts, self-contained).
BENCH_HTML ?= bin/bench-report.html
bench: build
	$(BIN) bench -launch 1 -scenario flash -units 1000 -requests 100000 -conns 64 -html $(BENCH_HTML)

# The full comparison table with Redis + Lua and PostgreSQL rows: installs
# redis-server and postgresql when missing, runs them on loopback, stops them.
bench-peers: build
	scripts/bench-peers.sh $(BIN)

# The README's picture of the operator's page: headless Chromium on a
# three-node cluster in the middle of a sale (docs/ui.png).
ui-screenshot:
	STOCKD_UI_SCREENSHOT=$(CURDIR)/docs/ui.png $(GO) test -count=1 -v -run 'TestUI_PageFollowsASaleLive' ./scenario

# The buyer's page at each state and the operator's page after the sale
# (docs/queue-page-*.png): headless Chromium on a three-node cluster.
queue-screenshots:
	STOCKD_QUEUE_SCREENSHOTS=$(CURDIR)/docs $(GO) test -count=1 -v -run 'TestQueuePage_ABuyerGoesThroughEveryState' ./scenario

# The picture of make bench's HTML report in docs/benchmarks.md: the
# report of a short run opened in headless Chromium (docs/bench-report.png).
bench-screenshot:
	STOCKD_BENCH_SCREENSHOT=$(CURDIR)/docs/bench-report.png $(GO) test -count=1 -v -run 'TestBenchReport_EveryStrategyDrawn' ./scenario

# The Go micro-benchmarks: shard variants and HTTP deduct vs a no-op handler.
bench-go:
	$(GO) test -run '^$$' -bench . -benchtime 2s -cpu 2 ./shard/ ./scenario

clean:
	rm -rf bin

# Three local nodes on 127.0.0.1:8081-8083 (raft 7001-7003), data under
# ./data/cluster/; cluster-stop stops them by their PID files.
cluster: build
	scripts/cluster.sh start $(BIN)

cluster-stop:
	scripts/cluster.sh stop

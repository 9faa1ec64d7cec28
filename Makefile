# lockproxy — see README.md.
GO        ?= go
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT    ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null)$(shell git diff --quiet HEAD 2>/dev/null || echo -dirty)
LDFLAGS   := -X main.version=$(VERSION) -X main.buildCommit=$(COMMIT)
BIN       := bin/lockproxy
FUZZTIME  ?= 10s

.PHONY: all build run test test-race soak test-unit test-e2e deps bench bench-passthrough fuzz vet fmt clean

all: build

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/lockproxy

## run: build and start lockproxy with three embedded in-process nodes.
run: build
	./$(BIN) --dev --log-format console

## deps: install what the tests need when missing (redis-server, redis-tools, zookeeper, python3-redis,
## nodejs, npm, nutcracker, systemd, prometheus from Debian's packages with apt-get as root, their
## services kept from starting; the tests' npm packages).
deps:
	./scripts/install-test-deps.sh

## test: install what is missing, then run every test (unit, fuzz seeds, end to end).
## The fault suite and the end-to-end tests load both cores themselves (rows two at a time, many
## lockproxy processes), so they run after the rest, the two of them side by side; the end-to-end
## tests take about half as long, so the PostgreSQL end-to-end package, which mostly waits on leases,
## runs after them in that slot. The other packages mostly wait on servers, sessions and lease timers
## (together they keep about half of the two cores busy), so three of them run at once, with their
## parallel tests four at a time; the longest two (the ZooKeeper end-to-end package, about two
## minutes of sessions expiring, and the Redis backend's) go first, so that neither starts last and
## runs alone.
FIRST_PKGS  := ./test/zk/ ./backends/redis/
SERIAL_PKGS := ./test/fault/ ./test/e2e/ ./test/postgres/
test: deps vet
	$(GO) test -count=1 -p 3 -parallel 4 -timeout 9m $(FIRST_PKGS) $$($(GO) list ./... | grep -v -e '/test/e2e$$' -e '/test/fault$$' -e '/test/postgres$$' -e '/test/zk$$' -e '/backends/redis$$')
	$(GO) test -count=1 -p 2 -timeout 9m $(SERIAL_PKGS)

## test-race: every test with the race detector, the lockproxy binary of the end-to-end tests included
## (its race reports go to $(RACE_LOG).*).
RACE_LOG ?= /tmp/lockproxy-race
test-race: deps
	rm -f $(RACE_LOG).*
	LOCKPROXY_TEST_BUILDFLAGS=-race GORACE=log_path=$(RACE_LOG) $(GO) test -race -count=1 -p 1 -timeout 15m ./...
	@if ls $(RACE_LOG).* >/dev/null 2>&1; then echo "data races in lockproxy:"; cat $(RACE_LOG).*; exit 1; fi

test-unit:
	$(GO) test -count=1 ./quorum/ ./resp/ ./commands/ ./conf/ ./backends/...

test-e2e: deps
	$(GO) test -count=1 -p 1 -timeout 9m ./test/...

## soak: the fault suite at full size: 20 clients × 10,000 grants per row (2,000 in slow-3-nodes, which grants only between its faults; fast-clock-1.5x-on-3-nodes injects its fault once), faults repeated until done or the row's 30 min (CI: 20 × 500).
## It also runs the ZooKeeper and PostgreSQL fault rows kept out of `make test` for time.
soak: deps
	LOCKPROXY_SOAK=1 $(GO) test -count=1 -p 1 -v -timeout 120m ./test/fault/
	LOCKPROXY_SOAK=1 $(GO) test -count=1 -p 1 -v -timeout 20m -run 'UnderServerFaults|UnderFaults' ./test/zk/ ./test/postgres/
	LOCKPROXY_SOAK=1 $(GO) test -count=1 -v -timeout 10m -run 'TestKeepaliveRenewalsSurviveOverload' ./commands/

## bench: LOCK+UNLOCK cycles through lockproxy vs redsync on the same real nodes, the
## passthrough table (redis-benchmark directly, through lockproxy, through twemproxy),
## the release script's time on a node per release, and cycles on the PostgreSQL backend.
bench: deps
	$(GO) test -run '^$$' -bench . -benchtime 3s -timeout 30m ./test/bench/
	$(GO) test -run '^$$' -bench ReleaseScript -benchtime 100000x ./backends/redis/
	$(GO) test -run '^$$' -bench PostgresCycles -benchtime 3s ./test/postgres/

## bench-passthrough: only the passthrough table.
bench-passthrough: deps
	$(GO) test -run '^$$' -bench Passthrough -benchtime 1x -timeout 20m ./test/bench/

## fuzz: run each fuzz target for FUZZTIME (names anchored: -fuzz takes a pattern that must match
## exactly one target).
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzReader$$' -fuzztime $(FUZZTIME) ./resp/
	$(GO) test -run '^$$' -fuzz '^FuzzReaderSplits$$' -fuzztime $(FUZZTIME) ./resp/
	$(GO) test -run '^$$' -fuzz '^FuzzInlineSplit$$' -fuzztime $(FUZZTIME) ./resp/
	$(GO) test -run '^$$' -fuzz '^FuzzParseInt$$' -fuzztime $(FUZZTIME) ./resp/
	$(GO) test -run '^$$' -fuzz '^FuzzParseLock$$' -fuzztime $(FUZZTIME) ./commands/
	$(GO) test -run '^$$' -fuzz '^FuzzGlobsIntersect$$' -fuzztime $(FUZZTIME) ./commands/
	$(GO) test -run '^$$' -fuzz '^FuzzLuaStrings$$' -fuzztime $(FUZZTIME) ./commands/
	$(GO) test -run '^$$' -fuzz '^FuzzLoad$$' -fuzztime $(FUZZTIME) ./conf/
	$(GO) test -run '^$$' -fuzz '^FuzzFrameEnd$$' -fuzztime $(FUZZTIME) ./relay/
	$(GO) test -run '^$$' -fuzz '^FuzzParseChild$$' -fuzztime $(FUZZTIME) ./backends/zookeeper/
	$(GO) test -run '^$$' -fuzz '^FuzzReadReply$$' -fuzztime $(FUZZTIME) ./backends/redis/
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeData$$' -fuzztime $(FUZZTIME) ./backends/zookeeper/

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))" || (echo "gofmt needed:"; gofmt -l .; exit 1)

fmt:
	gofmt -w .

clean:
	rm -rf bin

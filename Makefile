# Hawser: the two set-up commands are `make demo` and `make test`.
# Both install what is missing (Debian packages, the pinned Rust toolchain) and build in
# release mode, so they work on a fresh machine that has HOST_CMDS (below). `make doctor`
# says what this machine lacks; docs/testing.md says how a test gets the tools it needs.

SHELL := /bin/bash
CARGO ?= cargo
HAWSER := target/release/hawser
# Debian packages the tests and the demo use: real NBD clients, fio, filesystems, etcd, protoc
# (the etcd-client and hawser-csi crates generate gRPC code with it), and containerd, runc,
# CNI plugins and busybox for the real kubelet the CSI tests run; valgrind for
# `make instructions`; prometheus for `promtool check metrics` (the metrics test); chromium for
# the dashboard's browser test; procps (ps, kill), openssl (the API server's service-account
# key), gcc (the k8s pause image) and g++ (libFuzzer), which a minimal Debian lacks; for the
# tests in a real kernel (scripts/kvm/boot.sh), qemu-system-x86, and cpio, xz-utils and kmod
# (depmod, modprobe), which build its initramfs and which a minimal Debian lacks too;
# PostgreSQL 15 (postgresql-15, which brings postgresql-client-15: psql, pgbench, pg_amcheck)
# for the backup of a database under load (e2e backup_postgres).
APT_PACKAGES := fio valgrind libnbd-bin nbdkit qemu-utils e2fsprogs xfsprogs fuse3 iproute2 iptables etcd-server etcd-client protobuf-compiler containerd runc containernetworking-plugins busybox-static prometheus chromium procps openssl gcc g++ libc6-dev qemu-system-x86 cpio xz-utils kmod postgresql-15
# Commands whose absence means a package above is missing; every command the tests run that
# comes from one of them (scripts/check-tools.sh checks that). A program that is not on PATH
# is named by its path: Debian's PostgreSQL programs, in its versioned directory.
PG_BIN := /usr/lib/postgresql/15/bin
NEEDED_CMDS := fio valgrind callgrind_control nbdinfo nbdcopy nbdfuse nbdkit qemu-io mkfs.ext4 mkfs.xfs xfs_growfs fusermount3 ip iptables etcd etcdctl protoc containerd runc busybox promtool chromium ps kill openssl gcc c++ qemu-system-x86_64 cpio xz depmod modprobe modinfo rmmod $(addprefix $(PG_BIN)/,initdb postgres psql pgbench pg_amcheck)
# Commands make test needs and does not install: Debian's are too old (scripts/k8s/build.sh
# needs Go 1.24+, playwright-core Node.js 20+). The project's machines come with them;
# `make check-tools` stops make test at once when one is missing, `make doctor` says more.
HOST_CMDS := cargo go node npm
# What `make demo` needs: protoc for the build, and the NBD clients and fio of its tour.
DEMO_APT_PACKAGES := protobuf-compiler libnbd-bin qemu-utils fio
DEMO_CMDS := protoc nbdinfo qemu-io fio
# Kubernetes v1.33 binaries, csi-sanity, helm and kubeconform, and the backup tests' S3 server
# (SeaweedFS), built from the Go module proxy by scripts/k8s/build.sh into one cache (a second
# run is quick).
K8S_CACHE ?= $(HOME)/.cache/hawser-k8s
export HAWSER_K8S_CACHE := $(K8S_CACHE)
export HAWSER_K8S_BIN := $(K8S_CACHE)/bin

# The dashboard test's browser driver (playwright-core), from ui/package-lock.json.
UI_MODULES := ui/node_modules/.package-lock.json

.PHONY: all deps deps-demo check-tools doctor build upgrade-build unit-build e2e-build k8s-tools kvm-kernel ui fuzz-build test test-prereqs test-unit test-e2e check nextest demo bench instructions miri asan fmt lint clean fuzz

all: build

# Installs the Debian packages $(2) when a command of $(1) is missing (type -P: a program on
# PATH, as the tests run it; kill is a shell builtin too).
define install_missing
	@missing=""; for c in $(1); do type -P $$c >/dev/null || missing="$$missing $$c"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing packages (missing:$$missing)"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get update -qq && apt-get install -y -qq $(2) >/dev/null; \
	fi
	@command -v $(CARGO) >/dev/null || { echo "cargo not found: install rustup (https://rustup.rs)"; exit 1; }
endef

# Everything the tests use.
deps:
	$(call install_missing,$(NEEDED_CMDS),$(APT_PACKAGES))

# Only what the build and the demo's tour use, so a newcomer's first command does not wait
# for a browser, a kubelet's runtime or etcd.
deps-demo:
	$(call install_missing,$(DEMO_CMDS),$(DEMO_APT_PACKAGES))

# Fails when a test needs a tool that no step of make test provides (scripts/check-tools.sh;
# docs/testing.md): a second of reading sources, before the long steps.
check-tools:
	scripts/check-tools.sh

# What works on this machine for the tests and what is missing, with the fix
# (scripts/doctor.sh); POOL=DIR tries reflinks in DIR, where a replica pool would be.
doctor:
	@NEEDED_CMDS="$(NEEDED_CMDS)" HOST_CMDS="$(HOST_CMDS)" scripts/doctor.sh $(POOL)

k8s-tools: deps
	scripts/k8s/build.sh

# The guest kernel the tests in a real kernel boot (Debian's packaged kernel and an initramfs,
# by scripts/kvm/boot.sh into ~/.cache/hawser-kvm; a second run is quick). Its qemu, cpio, xz
# and kmod come from deps: the script installs nothing.
kvm-kernel: deps
	scripts/kvm/boot.sh --prepare

$(UI_MODULES): ui/package-lock.json
	cd ui && npm ci --ignore-scripts --no-audit --no-fund

# Rebuild the dashboard's bundle (ui/dist, embedded in the controller) from ui/src.
ui: $(UI_MODULES)
	cd ui && npm run build

build: deps-demo
	$(CARGO) build --release --workspace --bins

# A second executable, target/release/hawser-next: the agent-upgrade test (e2e kernel_devices)
# replaces a running agent with it. A copy of the build with a note in --version
# (scripts/build-note.sh), so make test does not compile the binary's crate a second time.
upgrade-build: build
	scripts/build-note.sh $(HAWSER) target/release/hawser-next "upgrade-test build"

# The end-to-end tests that run a second time with the controller on a real etcd
# (HAWSER_E2E_STORE=etcd), so both store backends pass "Replicated volumes over NBD".
E2E_ON_ETCD := --test replicated_volume --test bad_input

# Runs test step $(1), the command $(2), noting its times (scripts/test-times.sh); on a
# failure prints the times so far and stops.
timed = set -o pipefail; $(2) 2>&1 | scripts/test-times.sh $(1) || { scripts/test-times.sh --report; exit 1; }

# Everything make test builds or installs before its first test, two jobs at a time: the
# Go tools first (the longest, 14 min on a fresh machine), cargo-nextest's install, the
# release build, the unit and end-to-end steps' test binaries, clippy's build, the guest
# kernel, npm and the fuzz build (each of those in a directory of its own), so that one runs
# where another leaves a core idle (a link, one large crate at a time, a download). deps and
# deps-demo have run (-o: not again): a goal waiting on a phony prerequisite lost its turn to
# every goal after it, so the Go tools, first in the list, started seventh, after 433 s. On a
# fresh machine (docs/testing.md) the Go tools beside clippy and nextest's install took
# 14 min, against 26 one after another.
test-prereqs: check-tools deps deps-demo
	@scripts/test-times.sh --start
	$(call timed,builds,$(MAKE) -j2 --output-sync=target -o deps -o deps-demo k8s-tools nextest \
		build upgrade-build unit-build e2e-build lint kvm-kernel $(UI_MODULES) fuzz-build)

# The test binaries of make test's unit and end-to-end steps, as cargo-nextest builds them
# there (`cargo test --no-run` with the step's profile and packages): built here, beside
# the other builds, the steps find them up to date and only run.
unit-build: deps-demo
	$(CARGO) test --no-run --profile unit --workspace --exclude hawser-e2e
e2e-build: build
	$(CARGO) test --no-run --release -p hawser-e2e

# Unit, simulation and integration tests (through cargo-nextest, .config/nextest.toml's `ci`
# profile: each test in a process of its own, JUnit in target/nextest/ci/junit.xml; in the
# `unit` profile of Cargo.toml: the project's crates at opt-level 1, so they compile fast),
# the doc tests (nextest runs none), then the end-to-end tests against real clients
# (on the embedded store, then the NBD ones again on etcd; nextest's `e2e` profile, whose
# test groups say which tests may run side by side, JUnit in target/nextest/e2e/junit.xml).
# Ends with the slowest test binaries and each step's time.
test: test-prereqs
	$(call timed,unit,$(CARGO) nextest run --profile ci --cargo-profile unit --workspace --exclude hawser-e2e)
	$(call timed,doc,$(CARGO) test --doc --profile unit --workspace --exclude hawser-e2e)
	$(call timed,fuzz,scripts/fuzz.sh)
	$(call timed,e2e,HAWSER_BIN="$(abspath $(HAWSER))" \
		$(CARGO) nextest run --profile e2e --cargo-profile release -p hawser-e2e)
	$(call timed,e2e-etcd,HAWSER_E2E_STORE=etcd HAWSER_BIN="$(abspath $(HAWSER))" \
		$(CARGO) nextest run --profile e2e-etcd --cargo-profile release -p hawser-e2e $(E2E_ON_ETCD))
	@scripts/test-times.sh --report

# The inner loop (docs/testing.md): rustfmt, clippy, every crate's own tests (`--lib --bins`),
# the layout rules, and 25 of each simulator shard's 250 seeds, in the `unit` profile through
# cargo-nextest (.config/nextest.toml); JUnit in target/nextest/check/junit.xml. About 5 min
# warm after a one-file change; `make test` stays the whole run.
check: deps-demo nextest
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	HAWSER_SEEDS_PER_SHARD=25 $(CARGO) nextest run --profile check --cargo-profile unit \
		--workspace --exclude hawser-e2e --lib --bins --test seeds --test layout

# cargo-nextest, pinned, installed from crates.io when missing or of another version: about
# 4.5 min on 2 cores, once. Without its self-update (`cargo nextest self update`, an HTTP
# client that nothing here uses): 306 crates, not 333.
NEXTEST_VERSION := 0.9.151
nextest:
	@$(CARGO) nextest --version 2>/dev/null | grep -qF "cargo-nextest $(NEXTEST_VERSION)" || \
		$(CARGO) install cargo-nextest --version $(NEXTEST_VERSION) --locked \
		--no-default-features --features default-no-update

# Every fuzz target (fuzz/) for FUZZ_SECONDS each (default 20), on the pinned stable toolchain;
# installs cargo-fuzz from crates.io when missing. Fails on any crash.
fuzz: deps
	scripts/fuzz.sh

# cargo-fuzz and the fuzz targets' build only (in ~/.cache/hawser-fuzz/target, apart from
# target/, so beside the other builds).
fuzz-build: deps
	scripts/fuzz.sh --prepare

demo: build
	@scripts/demo.sh

# What `make bench`'s e2e tests measure of the cluster (issue 44), as JSON lines.
CLUSTER_FIGURES := $(abspath bench-cluster.jsonl)

bench: deps build k8s-tools kvm-kernel
	@scripts/bench.sh
	@# The frontends (kernel NBD, nbdfuse) in one guest kernel: ratios only (software emulation).
	@scripts/bench-frontends.sh
	@# ublk's queue count and depth, measured in a guest of two CPUs (ratios only).
	@scripts/bench-ublk-settings.sh
	@scripts/bench-resync.sh
	@scripts/bench-snapshots.sh
	@# Backup and restore throughput against the disk's sequential write, CPU per MiB.
	@scripts/bench-backup.sh
	@# The cluster figures of issue 44, each test appending its figures to $(CLUSTER_FIGURES),
	@# charted at the end beside it (bench-cluster.{idle,api,failover}.svg):
	@rm -f $(CLUSTER_FIGURES)
	@# idle cost of 10, 100 and 1,000 attached volumes on one agent: CPU, RSS, fds;
	@set -o pipefail; HAWSER_BENCH_FIGURES=$(CLUSTER_FIGURES) HAWSER_BIN=$(abspath $(HAWSER)) \
		$(CARGO) test --release -q -p hawser-e2e --test idle_volumes -- --ignored --nocapture 2>/dev/null | grep '^idle:'
	@set -o pipefail; HAWSER_BIN=$(abspath $(HAWSER)) $(CARGO) test --release -q -p hawser-e2e --test csi_footprint \
		-- --ignored --nocapture 2>/dev/null | grep '^csi:'
	@# the control plane with 100, 1,000 and 10,000 volumes on each store (embedded, etcd,
	@# Kubernetes): latency per operation, list times, the controller's RSS and idle CPU, the
	@# store's size;
	@set -o pipefail; for s in embedded etcd kubernetes; do for n in 100 1000 10000; do \
		HAWSER_E2E_STORE=$$s HAWSER_SCALE_VOLUMES=$$n HAWSER_SCALE_MEASURE_ONLY=1 HAWSER_BENCH_FIGURES=$(CLUSTER_FIGURES) \
		HAWSER_BIN=$(abspath $(HAWSER)) $(CARGO) test --release -q -p hawser-e2e --test control_plane_scale \
		-- --nocapture 2>/dev/null | grep '^scale:' || exit 1; done; done
	@# failover on Kubernetes: 10 power losses of a node, fault to first write elsewhere, with
	@# the kubelets' default node status interval (10 s) and with the 2 s docs/csi.md advises.
	@set -o pipefail; for s in 10 2; do HAWSER_KUBELET_STATUS_SECS=$$s HAWSER_FAILOVER_TRIALS=10 \
		HAWSER_BENCH_FIGURES=$(CLUSTER_FIGURES) HAWSER_BIN=$(abspath $(HAWSER)) \
		$(CARGO) test --release -q -p hawser-e2e --test k8s_failover \
		-- --nocapture --test-threads=1 2>/dev/null | grep '^failover:' || exit 1; done
	@$(HAWSER) bench --cluster-charts $(CLUSTER_FIGURES)

# Instructions per request under callgrind: a CPU-per-I/O figure a noisy machine cannot move.
instructions: deps build
	@scripts/instructions.sh

# The data path's own unsafe code (page-aligned buffers and their free list) under Miri, which
# needs a nightly toolchain with its miri component (installed when missing). The other
# unsafe blocks are system calls (libc), which Miri cannot run.
miri:
	@rustup component list --toolchain nightly --installed 2>/dev/null | grep -q '^miri' || \
		rustup toolchain install nightly --profile minimal --component miri,rust-src
	$(CARGO) +nightly miri test -p hawser-storage --lib aligned

# The io_uring path's unsafe code (hawser-storage/src/ring.rs: entries pointing into buffers the
# kernel reads or fills until their completion is reaped) and the epoch gate under
# AddressSanitizer, since Miri cannot run io_uring's system calls. Needs a nightly toolchain
# (installed when missing); builds into target/asan.
asan:
	@rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
	RUSTFLAGS=-Zsanitizer=address $(CARGO) +nightly test --target x86_64-unknown-linux-gnu \
		--target-dir target/asan -p hawser-storage --lib -- ring gate

fmt:
	$(CARGO) fmt --all

lint:
	CARGO=$(CARGO) scripts/check-features.sh
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

clean:
	$(CARGO) clean

# The two commands the README promises. Cargo's target directory may be
# shared between clones through CARGO_TARGET_DIR.

.PHONY: run test docs-check proto-compat proto-baseline chart-baseline previous-release bench bench-large bench-autoscaler bench-targets bench-xl soak

# The whole system on loopback on the simulated cloud (see README), the
# volume controller and the simulated node plugins included. Upstream's
# CSI sidecars are third-party builds: named by the variables the tests
# read (e.g. CSI_PROVISIONER=../shared/bin/csi-provisioner-v6.3.0-56 and
# CSI_ATTACHER=...), they run too, and a Pod's claim goes the whole way.
SIDECAR_FLAGS := $(if $(CSI_PROVISIONER),--csi-provisioner $(CSI_PROVISIONER)) \
	$(if $(CSI_ATTACHER),--csi-attacher $(CSI_ATTACHER)) \
	$(if $(CSI_RESIZER),--csi-resizer $(CSI_RESIZER)) \
	$(if $(CSI_SNAPSHOTTER),--csi-snapshotter $(CSI_SNAPSHOTTER)) \
	$(if $(SNAPSHOT_CONTROLLER),--snapshot-controller $(SNAPSHOT_CONTROLLER))
run:
	cargo build --bins
	cargo run --bin sandbox -- --volumes $(strip $(SIDECAR_FLAGS))

# The buf CLI, at the version tools/buf pins (npm carries its binary).
BUF := tools/buf/node_modules/.bin/buf
$(BUF): tools/buf/package.json tools/buf/package-lock.json
	npm ci --prefix tools/buf --silent --no-audit --no-fund
	touch $@

# Fails on any change to cloudgateway.v1 that breaks, on the wire or in
# JSON, what the last release's controllers or gateways expect
# (proto/compat/baseline.json; see RELEASING.md). Additions pass.
proto-compat: $(BUF)
	$(BUF) breaking proto --against proto/compat/baseline.json

# At a release only: the contract as it stands becomes the baseline.
proto-baseline: $(BUF)
	$(BUF) build proto --exclude-source-info -o proto/compat/baseline.json

# At a release only: what `helm upgrade` from it must keep (immutable
# selectors, Service ports, the objects the last release's pods use),
# which `helm/check.py check` compares the chart with.
chart-baseline:
	python3 helm/check.py upgrade-baseline

# The previous release's gateway and controllers, which the version skew
# test upgrades from (tools/previous-release/release.toml): built once per
# commit, kept beside cargo's target directory.
previous-release:
	bash tools/previous-release/build.sh

# Every path, file, module, flag and test the docs name in backticks exists,
# and BENCHMARKS.md's main table names a commit of HEAD's history (the rules:
# tools/docs-check/src/lib.rs).
docs-check:
	cargo run --quiet --package ccm-docs-check -- .

# Everything the tests need, then every test of the workspace.
test: docs-check proto-compat previous-release
	python3 -m pip install --quiet --disable-pip-version-check -r tests/requirements.txt
	cargo test --doc -p cloud-gateway -p ccm-provider
	# The tests start the real binaries (gateway-conformance too): build
	# them, so a target directory shared between clones never serves a
	# stale one.
	cargo build --bins
	cargo nextest run --workspace --no-fail-fast

# The benchmark table (BENCHMARKS.md): release binaries, both profiles, one run.
# Scenario 10 counts a real cluster-autoscaler's own loop too where
# CLUSTER_AUTOSCALER names its binary (../shared/bin/README.md).
bench:
	cargo build --release --bins
	cargo run --release --bin bench -- --out BENCHMARKS.md

# The same with ten times the nodes and Services of scenarios 1, 2 and 5
# beside the first sizes (33 minutes on 2 cores).
bench-large:
	cargo build --release --bins
	cargo run --release --bin bench -- --out BENCHMARKS.md --join-nodes 1000,5000 --steady-nodes 1000,10000 --memory 5000x2000,10000x5000 --steady-in-clear false

# Scenario 10 alone (Cluster Autoscaler's loop at 1,000 and 10,000 nodes),
# as its own section of BENCHMARKS.md.
bench-autoscaler:
	cargo build --release --bins
	cargo run --release --bin bench -- --out BENCHMARKS.md --section autoscaler --only 10 --autoscaler-nodes 1000,10000

# Scenario 11 (issue #46) at 1,000, 10,000 and 100,000 nodes, as
# BENCHMARKS.md's `targets` section.
bench-targets:
	cargo build --release --bins
	cargo run --release --bin bench -- --out BENCHMARKS.md --section targets --only 11,12

# Round three's sizes (issue #30), as BENCHMARKS.md's `xl` section: 10,000
# nodes joining; the steady state, memory and a leader's takeover at 1,000,
# 10,000 and 100,000 nodes, with the growth plots. The upstream profile runs
# where it would not take more than five minutes. 25 minutes on 2 cores;
# needs about 16 GiB free for the API test server at 100,000 Nodes.
bench-xl:
	cargo build --release --bins
	cargo run --release --bin bench -- --out BENCHMARKS.md --section xl --only 1,2,5,9 --join-nodes 10000 --steady-nodes 1000,10000,100000 --memory 1000x200,10000x2000,100000x20000 --takeover 10000x2000,100000x20000 --steady-in-clear false

# The chaos soak (BENCHMARKS.md, "Reliability"): an hour of churn, cloud
# faults and processes killed or frozen at random, invariants checked all
# along. Debug binaries: it is about what breaks, not how fast.
soak:
	cargo build --bins
	cargo run --bin soak -- --out BENCHMARKS.md

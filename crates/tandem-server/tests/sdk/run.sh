#!/usr/bin/env bash
# SDK tests: the official `openai` and `anthropic` Python packages against `tandem serve` on
# loopback (the tiny Qwen2 fixture for the real engine path, the scripted backend for tool
# calls and reasoning), and an `openai-agents` run on qwen2.5-coder-0.5b (make models).
# Needs python3 with venv + pip and access to PyPI on first run.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../../.." && pwd)"
cd "$root"
CARGO="${CARGO:-cargo}"
venv="${TANDEM_SDK_VENV:-$root/target/sdk-venv}"

if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import openai, anthropic, agents" 2>/dev/null; then
    echo "sdk: creating $venv and installing openai + anthropic + openai-agents"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check --upgrade openai anthropic openai-agents
fi
agent_model="$root/models/qwen2.5-coder-0.5b.gguf"
[ -e "$agent_model" ] || { echo "sdk: $agent_model is missing (make models fetches it)"; exit 1; }
"$CARGO" build -q --bin tandem
bin="${CARGO_TARGET_DIR:-$root/target}/debug/tandem"
exec "$venv/bin/python" "$here/test_sdk.py" --bin "$bin" --fixture "$root/fixtures/tiny/qwen2" --script "$here/script.json" --agent-model "$agent_model"

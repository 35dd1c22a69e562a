#!/usr/bin/env bash
# SDK tests: the official `openai` and `anthropic` Python packages against `tandem serve` on
# loopback (the tiny Qwen2 fixture for the real engine path, the scripted backend for tool
# calls and reasoning). Needs python3 with venv + pip and access to PyPI on first run.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../../.." && pwd)"
cd "$root"
CARGO="${CARGO:-cargo}"
venv="${TANDEM_SDK_VENV:-$root/target/sdk-venv}"

if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import openai, anthropic" 2>/dev/null; then
    echo "sdk: creating $venv and installing openai + anthropic"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check --upgrade openai anthropic
fi
"$CARGO" build -q --bin tandem
bin="${CARGO_TARGET_DIR:-$root/target}/debug/tandem"
exec "$venv/bin/python" "$here/test_sdk.py" --bin "$bin" --fixture "$root/fixtures/tiny/qwen2" --script "$here/script.json"

#!/usr/bin/env bash
# MLX checkpoints against mlx-lm itself, live (issue 18): installs mlx and mlx-lm from PyPI
# into target/mlx-venv (once), converts the tiny Llama and the hybrid fixtures with mlx-lm's own
# converter in every mode the committed fixtures cover and with `tandem convert --mlx`
# (scripts/gen_mlx_fixtures.py, into target/mlx-fixtures), and runs tandem's MLX tests against
# those conversions and mlx-lm's logits on them. Needs python3 with venv + pip and access to PyPI on first run.
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO="${CARGO:-cargo}"
venv="${TANDEM_MLX_VENV:-$PWD/target/mlx-venv}"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import mlx.core, mlx_lm, safetensors" 2>/dev/null; then
    echo "test-mlx: creating $venv and installing mlx 0.32.4 + mlx-lm 0.32.2"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check mlx==0.32.4 mlx-cpu==0.32.4 mlx-lm==0.32.2 safetensors numpy
fi
out="$PWD/target/mlx-fixtures"
rm -rf "$out" && mkdir -p "$out"
ln -s "$PWD/fixtures/tiny" "$out/tiny"
ln -s "$PWD/fixtures/hybrid" "$out/hybrid"
# tandem's own MLX writer (`tandem convert --mlx`) on the same sources, loaded by mlx-lm too.
"$CARGO" build -q --bin tandem
TANDEM_BIN="$PWD/target/debug/tandem" "$venv/bin/python" scripts/gen_mlx_fixtures.py "$out" > "$out/convert.log" 2>&1 \
    || { tail -20 "$out/convert.log"; exit 1; }
TANDEM_MLX_FIXTURES="$out/mlx" "$CARGO" test -q -p tandem-model --test mlx

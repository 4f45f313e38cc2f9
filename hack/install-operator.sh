#!/bin/sh
# Installs the operator with its runtime dependencies only (none of the `sim` or `test`
# extras) into a new virtualenv at $1. The Dockerfile's build stage runs this;
# tests/integration/test_image.py runs it on a clean virtualenv and starts the result.
set -eu
venv=$1
src=$(cd "$(dirname "$0")/.." && pwd)
"${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/pip" install --quiet "$src"
"$venv/bin/pip" check

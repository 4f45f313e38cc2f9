#!/bin/sh
# Installs the operator with its runtime dependencies only (none of the `sim` or `test`
# extras) into a new virtualenv at $1: first exactly the wheels pinned, with their hashes,
# in hack/operator-requirements.txt (`make lock`; no source builds, whose build tools would
# not be pinned), then the operator itself without resolving anything, so that no unpinned
# package gets in. The Dockerfile's build stage runs this; tests/integration/test_image.py
# runs it on a clean virtualenv and starts the result.
set -eu
venv=$1
src=$(cd "$(dirname "$0")/.." && pwd)
"${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/pip" install --quiet --require-hashes --no-deps --only-binary :all: \
    -r "$src/hack/operator-requirements.txt"
"$venv/bin/pip" install --quiet --no-deps "$src"
"$venv/bin/pip" check

#!/bin/sh
# Installs the operator with its runtime dependencies only (none of the `sim` or `test`
# extras) into a new virtualenv at $1: first exactly the wheels pinned, with their hashes,
# in hack/operator-requirements.txt and hack/build-requirements.txt (`make lock`; no source
# builds, whose build tools would not be pinned), then the operator itself without
# resolving anything, so that no unpinned package gets in. It is built by that pinned
# setuptools, which pip checks against pyproject's [build-system]: build isolation would
# fetch an unpinned one. The setuptools stays in the virtualenv (Python 3.11's venv seeds
# one anyway). The Dockerfile's build stage runs this; tests/integration/test_image.py runs
# it on a clean virtualenv and starts the result.
set -eu
venv=$1
src=$(cd "$(dirname "$0")/.." && pwd)
"${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/pip" install --quiet --require-hashes --no-deps --only-binary :all: \
    -r "$src/hack/operator-requirements.txt" -r "$src/hack/build-requirements.txt"
"$venv/bin/pip" install --quiet --no-deps --no-build-isolation --check-build-dependencies "$src"
"$venv/bin/pip" check

# syntax=docker/dockerfile:1
# The operator image: `vllm-autotuner run` on a slim Python, as a non-root user, with the
# operator's runtime dependencies only (no simulator extras: no numpy, no matplotlib).
#   docker build -t ghcr.io/vllm-tuning/vllm-autotuner:0.1.0 .
# Its flags come from the chart's Deployment args; settings also from the environment
# (PROMETHEUS_URL, WATCH_NAMESPACES, POD_NAMESPACE).
# Two builds of one commit get the same base and the same packages: the base is pinned by
# its patch release and by the digest of its multi-platform index, the packages by
# hack/operator-requirements.txt and the setuptools that builds the operator's wheel by
# hack/build-requirements.txt (`make lock`). To bump the base, take the newest tag
# python:3.11.<patch>-slim-bookworm and its digest from
#   docker buildx imagetools inspect python:3.11.<patch>-slim-bookworm
# (its `Digest:` line).
ARG PYTHON_IMAGE=python:3.11.16-slim-bookworm@sha256:c425d915a89a6dcd3183b1797ad9bd8878caff5a417f6371c8df93c8ea8b727f

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY hack/install-operator.sh hack/operator-requirements.txt hack/build-requirements.txt hack/
RUN hack/install-operator.sh /opt/vllm-autotuner

FROM ${PYTHON_IMAGE}
# The chart runs it with a read-only root filesystem: no bytecode writes, HOME and temp
# files under /tmp (an emptyDir there).
ENV PATH=/opt/vllm-autotuner/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
RUN groupadd --system --gid 10001 autotuner \
 && useradd --system --uid 10001 --gid autotuner --no-create-home --home-dir /tmp \
      --shell /usr/sbin/nologin autotuner
COPY --from=build /opt/vllm-autotuner /opt/vllm-autotuner
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["vllm-autotuner", "run"]

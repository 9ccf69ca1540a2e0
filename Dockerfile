# The controller's image. A pushed release tag vX.Y.Z would build it for linux/amd64 and
# linux/arm64, push it to ghcr.io/rebalancer-project/rebalancer:X.Y.Z (the chart's default image)
# and sign it (.github/workflows/release.yml); none has been pushed. Your own build:
# `docker build -t REGISTRY/rebalancer:X.Y.Z .`, push it, and set the chart's image.repository;
# without Docker, `make release` replays this file's build stage (tools/image.py)
# (charts/rebalancer/README.md, "The image").
#
# Two stages: the first installs the package and its dependencies into a virtual environment
# (every dependency ships wheels, so nothing is compiled); the second is a slim Python with that
# environment copied in, no pip, no compiler, running as an unprivileged user. The chart runs it
# with a read-only root filesystem: nothing here writes outside /tmp and /var/lib/rebalancer.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/rebalancer
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY rebalancer ./rebalancer
COPY strategies ./strategies
RUN /opt/rebalancer/bin/pip install . \
 && /opt/rebalancer/bin/pip uninstall --yes pip setuptools \
 && cd / && /opt/rebalancer/bin/python -c "import rebalancer.cli, strategies"

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="rebalancer" \
      org.opencontainers.image.description="Lends idle inference GPU nodes to preemptible training and takes them back." \
      org.opencontainers.image.licenses="Apache-2.0"
# The base image's own pip goes too: the final image installs nothing.
RUN python -m pip uninstall --yes pip setuptools wheel 2>/dev/null || true \
 && mkdir -p /var/lib/rebalancer \
 && chown 65532:65532 /var/lib/rebalancer
COPY --from=build /opt/rebalancer /opt/rebalancer
ENV PATH=/opt/rebalancer/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
WORKDIR /var/lib/rebalancer
EXPOSE 8443 8081
ENTRYPOINT ["rebalancer"]
CMD ["run"]

# syntax=docker/dockerfile:1
# The session-archiver container image: a wheel and a venv built in one stage, only the venv copied
# into a slim runtime that runs `archiver` as UID/GID 65534 with a read-only root filesystem.
#
# Image contract (the Helm chart's defaults rely on it; README "Container image"):
#   ENTRYPOINT ["archiver"] (on PATH, /opt/archiver/bin), default command `run`
#   user 65534:65534 (nobody:nogroup), no shell needed at run time
#   writes only to /var/lib/archiver (state DB and spool: mount a volume) and /tmp (a tmp volume)
#   /metrics, /healthz, /readyz on port 9877
#
# BASE must be a Debian bookworm-like image with python3.11 and its venv module (python3-venv);
# the default is the public slim Python image. CI builds on a local mmdebstrap rootfs instead
# (tests/test_image.py), because no image registry is reachable there.
ARG BASE=python:3.11-slim-bookworm

FROM ${BASE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
# Only what the wheel is built from: a change to the tests or docs does not rebuild the venv.
COPY pyproject.toml README.md LICENSE CHANGELOG.md MANIFEST.in ./
COPY archiver ./archiver
# python3 (not python): the Debian base has no `python` alias. The venv lives where the runtime
# stage puts it, so its scripts' shebangs stay right after the copy. Behind a TLS-inspecting proxy,
# give pip the proxy's CA bundle as the optional build secret `build-ca`
# (`--secret id=build-ca,src=/etc/ssl/certs/ca-certificates.crt`): it is mounted for this step only
# and never stored in a layer.
RUN --mount=type=secret,id=build-ca,target=/run/secrets/build-ca.crt,required=false \
    if [ -s /run/secrets/build-ca.crt ]; then export PIP_CERT=/run/secrets/build-ca.crt; fi \
 && python3 -m venv /opt/archiver \
 && /opt/archiver/bin/python -m pip install --upgrade pip \
 && /opt/archiver/bin/python -m pip wheel --no-deps --wheel-dir /tmp/dist . \
 && /opt/archiver/bin/python -m pip install /tmp/dist/*.whl \
 && /opt/archiver/bin/python -m pip uninstall -y pip \
 && /opt/archiver/bin/archiver --version

FROM ${BASE}
# Label values only (`archiver --version` reads the installed package): the version lives in
# pyproject.toml, so builds pass it, e.g. --build-arg VERSION=0.1.0 --build-arg REVISION=$(git rev-parse HEAD).
ARG VERSION=unknown
ARG REVISION=unknown
LABEL org.opencontainers.image.title="session-archiver" \
      org.opencontainers.image.description="Prometheus exporter and forensic archiver for a game-server session hosting service" \
      org.opencontainers.image.source="https://github.com/session-archiver/session-archiver" \
      org.opencontainers.image.url="https://github.com/session-archiver/session-archiver" \
      org.opencontainers.image.documentation="https://github.com/session-archiver/session-archiver#deploying" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/archiver /opt/archiver
# The state dir must exist and belong to 65534 for `docker run` without a volume; a mounted volume
# gets its ownership from fsGroup (Kubernetes) instead.
RUN mkdir -p /var/lib/archiver && chown 65534:65534 /var/lib/archiver && chmod 0750 /var/lib/archiver
# No .pyc writes on a read-only root (the venv's are compiled at install time); unbuffered logs;
# HOME on the tmp volume for libraries that look there (botocore reads ~/.aws when present).
# No ARCHIVER_* variables: they would outrank the chart's config file (flag > env > file).
ENV PATH=/opt/archiver/bin:${PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
# The state dir is the working directory so relative paths (the default --state-dir
# .archiver-state, `archiver demo`'s ./demo-archive) land on the writable volume.
WORKDIR /var/lib/archiver
USER 65534:65534
EXPOSE 9877
VOLUME ["/var/lib/archiver"]
ENTRYPOINT ["archiver"]
CMD ["run"]

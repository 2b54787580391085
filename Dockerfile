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
# (tests/deploy/test_image.py), because no image registry is reachable there.
ARG BASE=python:3.11-slim-bookworm

FROM ${BASE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
# Every package is the locked version with its hash (requirements/, `make lock`): a rebuild installs
# the same bytes whatever the index serves that day. The locks come first, in a layer of their own:
# a change to the code does not download the dependencies again. A build venv (the locked pip and
# setuptools) installs into the runtime venv, which gets no pip or setuptools of its own.
# python3 (not python): the Debian base has no `python` alias. The venv lives where the runtime
# stage puts it, so its scripts' shebangs stay right after the copy. Behind a TLS-inspecting proxy,
# give pip the proxy's CA bundle as the optional build secret `build-ca`
# (`--secret id=build-ca,src=/etc/ssl/certs/ca-certificates.crt`): it is mounted for this step only
# and never stored in a layer.
COPY requirements/build.txt requirements/runtime.txt ./requirements/
RUN --mount=type=secret,id=build-ca,target=/run/secrets/build-ca.crt,required=false \
    if [ -s /run/secrets/build-ca.crt ]; then export PIP_CERT=/run/secrets/build-ca.crt; fi \
 && python3 -m venv /tmp/build-venv \
 && /tmp/build-venv/bin/python -m pip install --require-hashes -r requirements/build.txt \
 && python3 -m venv --without-pip /opt/archiver \
 && /tmp/build-venv/bin/python -m pip --python /opt/archiver/bin/python install --require-hashes -r requirements/runtime.txt
# Only what the wheel is built from: a change to the tests or docs does not rebuild it.
COPY pyproject.toml README.md LICENSE CHANGELOG.md MANIFEST.in ./
COPY archiver ./archiver
# The release this image is labelled with (the runtime stage's label): when given, the build fails
# unless it is the version of the package built here (pyproject.toml), so the label cannot lie.
# Nothing is downloaded here: the wheel is built by the locked setuptools, without dependencies.
ARG VERSION=unknown
RUN /tmp/build-venv/bin/python -m pip wheel --no-deps --no-build-isolation --wheel-dir /tmp/dist . \
 && /tmp/build-venv/bin/python -m pip --python /opt/archiver/bin/python install --no-deps /tmp/dist/*.whl \
 && built="$(/opt/archiver/bin/archiver --version)" && echo "$built" \
 && if [ "$VERSION" != unknown ] && [ "$built" != "archiver, version $VERSION" ]; then \
      echo "VERSION=$VERSION but the package built is: $built (pass pyproject.toml's version: make image)" >&2; \
      exit 1; \
    fi

FROM ${BASE}
# Label values only (`archiver --version` reads the installed package): the version lives in
# pyproject.toml and `make image` passes it (the build stage refuses any other), with the commit:
# --build-arg VERSION=<pyproject version> --build-arg REVISION=$(git rev-parse HEAD).
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

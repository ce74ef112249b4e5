# The hermes-batch project image: the flow, its dependencies and bubblewrap, for a Docker work pool.
#
#   docker build -t hermes-batch:local .        # FROM the official Python image (prefect.yaml's image name)
#   docker build --network host --build-arg BASE=hermes-test/python:bookworm \
#     --build-arg EXTRA_CA_CERTS="$(cat /usr/local/share/ca-certificates/*.crt)" -t hermes-batch:local .
#                                               # no registry: CI's local Debian base, behind a TLS proxy
#
# BASE is any Debian 12 (bookworm) image with Python 3.11: the official python:3.11-slim-bookworm
# (the default), or a local debootstrap image when no container registry is reachable (only the
# Debian mirror and PyPI are needed: apt and pip run during the build). The project is installed
# in the virtual environment /opt/venv; the checkout's files are in /opt/hermes-batch, the working
# directory of the flow runs (prefect.yaml's `generate-docker` deployment). Outputs go to /data:
# mount a volume there. No key is baked in: the worker passes its environment names at run time.
# See deployments/OPERATIONS.md, "The flow in a container".
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}
# Behind a TLS-intercepting proxy: the proxy's CA certificates (PEM text, public), trusted by apt
# and pip during the build, e.g. --build-arg EXTRA_CA_CERTS="$(cat /usr/local/share/ca-certificates/*.crt)"
ARG EXTRA_CA_CERTS=""

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    DO_NOT_TRACK=1 \
    PREFECT_SERVER_ANALYTICS_ENABLED=false

# bubblewrap for terminal_env=local where the container may create namespaces, ripgrep for
# search_files; python3-venv only where the base's Python lacks venv (Debian's python3).
RUN apt-get update \
 && apt-get install -y --no-install-recommends bubblewrap ripgrep ca-certificates \
 && if [ -n "$EXTRA_CA_CERTS" ]; then printf '%s\n' "$EXTRA_CA_CERTS" > /usr/local/share/ca-certificates/build-extra.crt \
      && update-ca-certificates >/dev/null; fi \
 && (python3 -c "import ensurepip" 2>/dev/null || apt-get install -y --no-install-recommends python3-venv) \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb

# Dependencies first (a layer that changes only with pyproject.toml), then the project.
WORKDIR /opt/hermes-batch
COPY pyproject.toml ./
RUN python3 -m venv /opt/venv \
 && python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' > /tmp/requirements.txt \
 && PIP_CERT=/etc/ssl/certs/ca-certificates.crt /opt/venv/bin/pip install -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt
ENV PATH=/opt/venv/bin:$PATH \
    VIRTUAL_ENV=/opt/venv
COPY . .
RUN pip install --no-deps . && mkdir -p /data

CMD ["hermes-batch", "--help"]

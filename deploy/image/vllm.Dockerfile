# syntax=docker/dockerfile:1
#
# The vLLM engine image that deploy/kubernetes/examples/vllm.yaml runs:
# vLLM's official image plus the pegad Python package (clients/python),
# whose pegad.vllm module is the connector (docs/engines.md).
#
# Build from the repository root: `make image-vllm` runs
#
#   docker build -f deploy/image/vllm.Dockerfile -t ghcr.io/pegaflow/vllm-pegad:TAG .
#
# with TAG VLLM_VERSION-pegad<clients/python's version>, the image the
# example runs.
#
# vLLM is pinned twice, here and only here (docs/engines.md and the
# example follow; deploy/kubernetes/image_test.go checks they agree):
# - by release, VLLM_VERSION: the vllm/vllm-openai tag built on (the build
#   fails unless the image's vllm reports that version);
# - by commit, VLLM_COMMIT: the upstream commit whose KVConnectorBase_V1
#   signatures the connector is tested against
#   (clients/python/tests/stubs). Bump both together, after the stubs.
ARG VLLM_VERSION=v0.33.0
ARG VLLM_COMMIT=00f4240ee6458263d76cf51ca7901ce1350bb4d1

FROM vllm/vllm-openai:${VLLM_VERSION} AS engine
ARG VLLM_VERSION
ARG VLLM_COMMIT
# grpcio and protobuf (cluster prefetch) come along as the package's
# dependencies where the image lacks them.
COPY clients/python/ /tmp/pegad-python/
# vLLM's image installs its Python packages with uv where it has it.
RUN if command -v uv >/dev/null; then uv pip install --system --no-cache /tmp/pegad-python; \
    else python3 -m pip install --no-cache-dir /tmp/pegad-python; fi \
 && rm -rf /tmp/pegad-python \
 && python3 -c 'import sys, vllm, pegad.vllm; want = sys.argv[1].removeprefix("v"); sys.exit(None if vllm.__version__ == want else f"vllm {vllm.__version__} in the base image, want {want}")' "${VLLM_VERSION}"
LABEL org.opencontainers.image.title="vllm-pegad" \
      org.opencontainers.image.description="vLLM with the pegad KV connector (pegad.vllm)" \
      org.opencontainers.image.source="https://github.com/pegaflow/pegad" \
      io.pegaflow.vllm.version="${VLLM_VERSION}" \
      io.pegaflow.vllm.commit="${VLLM_COMMIT}"
# Every engine of a fleet must hash blocks alike (docs/engines.md, fleet
# settings): the example also passes --prefix-caching-hash-algo sha256_cbor.
ENV PYTHONHASHSEED=0
# vLLM's entrypoint (vllm serve) is kept: the example passes its flags.

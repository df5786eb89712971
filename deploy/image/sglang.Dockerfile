# halyard-sglang: the image of managed-server workers (`halyard worker --gpu 0,1` with a
# sweep's `backend = "server"`, `server = "sglang"`; the gpu-server pools of `halyard deploy
# k8s`). SGLang's image, pinned to a release, with halyard added, run as our user
# (UID 10001) with a passwd entry, and HOME and every cache under /var/cache/halyard, a
# volume the pod mounts writable (the root file system is read-only in the pods).
#
#   docker build -f deploy/image/sglang.Dockerfile -t halyard-sglang:0.1.0 .
#   docker build -f deploy/image/sglang.Dockerfile --build-arg SERVER_IMAGE=lmsysorg/sglang:v0.5.5 -t halyard-sglang:0.1.0 .
#
# Why each part (issue 46):
# - the passwd entry: the server (torch, getpass) calls getpwuid() for its user; vLLM
#   run as a UID with no entry dies at start (vLLM issue #44548);
# - HOME, XDG_CACHE_HOME, HF_HOME, TRITON_CACHE_DIR, VLLM_CACHE_ROOT,
#   TORCHINDUCTOR_CACHE_DIR, FLASHINFER_WORKSPACE_BASE, OUTLINES_CACHE_DIR: each under
#   /var/cache/halyard (the image's defaults are under the image's root or HOME, which
#   the pods mount read-only); the generated manifests set the same and mount a volume
#   there;
# - halyard is built in a stage on the same base image, so that it links against the
#   glibc that runs it (a binary from another distribution may need a newer one);
# - the entrypoint is `halyard worker` (the manifests give `command` explicitly as well).
#
# NOT BUILT OR RUN IN CI: the project's machines reach no registry and have no GPU.
# deploy/image/check (in deploy/check) checks its structure: the pinned base, the user
# and its passwd entry, HOME and the caches on the declared volume, the entrypoint.

ARG SERVER_IMAGE=lmsysorg/sglang:v0.5.5

FROM ${SERVER_IMAGE} AS build
ARG RUST_VERSION=1.95.0
USER root
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
       ca-certificates curl build-essential pkg-config \
    && rm -rf /var/lib/apt/lists/*
ENV RUSTUP_HOME=/usr/local/rustup \
    CARGO_HOME=/usr/local/cargo \
    PATH=/usr/local/cargo/bin:$PATH
RUN curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs \
    | sh -s -- -y --profile minimal --default-toolchain "${RUST_VERSION}"
WORKDIR /src
COPY . .
# No CUDA feature: the server runs the model, halyard only talks to it.
RUN cargo build --release --locked -p halyard \
    && objcopy --strip-debug target/release/halyard /halyard \
    && /halyard --version

FROM ${SERVER_IMAGE}
USER root
RUN groupadd --gid 10001 halyard \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /var/cache/halyard/home \
       --shell /usr/sbin/nologin halyard \
    && install -d -o 10001 -g 10001 /var/cache/halyard /var/cache/halyard/home /var/lib/halyard
COPY --from=build /halyard /usr/local/bin/halyard
ENV HOME=/var/cache/halyard/home \
    XDG_CACHE_HOME=/var/cache/halyard/xdg \
    HF_HOME=/var/cache/halyard/huggingface \
    TRITON_CACHE_DIR=/var/cache/halyard/triton \
    VLLM_CACHE_ROOT=/var/cache/halyard/vllm \
    TORCHINDUCTOR_CACHE_DIR=/var/cache/halyard/torchinductor \
    FLASHINFER_WORKSPACE_BASE=/var/cache/halyard/flashinfer \
    OUTLINES_CACHE_DIR=/var/cache/halyard/outlines \
    HF_HUB_DISABLE_TELEMETRY=1 \
    SGLANG_DISABLE_USAGE_STATS=1 \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001:10001
WORKDIR /var/lib/halyard
# HOME and the caches; worker checkpoints (--state).
VOLUME ["/var/cache/halyard", "/var/lib/halyard"]
# Worker metrics (and /healthz, /readyz).
EXPOSE 9465
ENTRYPOINT ["/usr/local/bin/halyard", "worker"]
CMD ["--help"]

# halyard with CUDA: the image of GPU workers (`halyard worker --gpu N`, local GGUF models
# offloaded to an NVIDIA GPU; deploy/k8s/overlays/gpu runs it as halyard-cuda:0.1.0).
# Unlike deploy/image/Dockerfile (FROM scratch, a binary built on this machine), it builds
# Halyard from source in NVIDIA's CUDA *devel* image (nvcc and the CUDA libraries that
# llama.cpp compiles and links against) and runs it on NVIDIA's CUDA *runtime* image.
#
#   docker build -f deploy/image/cuda.Dockerfile -t halyard-cuda:0.1.0 .
#   docker build -f deploy/image/cuda.Dockerfile --build-arg CUDA_ARCHITECTURES="80;86;89;90" -t halyard-cuda:0.1.0 .
#
# The build context is the repository root; cuda.Dockerfile.dockerignore (BuildKit, the
# default builder since Docker 23) sends the sources, not target/ or models/. The build
# needs the network (Ubuntu packages, rustup, crates.io) and no GPU. The feature is the
# CLI's `cuda` (halyard-worker/cuda, llama-cpp-2/cuda: GGML_CUDA=ON; cudart and cuBLAS
# linked statically, libcuda.so.1 from the driver at run time).
#
# NOT BUILT OR RUN IN CI: the project's machines reach no image registry and have no GPU
# or CUDA toolkit. deploy/image/check (in deploy/check) checks this file's structure:
# instructions, stages and their bases, the feature, the user, the capabilities.

ARG CUDA_VERSION=12.4.1
ARG UBUNTU_VERSION=22.04

FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu${UBUNTU_VERSION} AS build
# The toolchain CI builds with (the workspace's rust-version is the minimum, not a promise
# that every locked dependency builds with it).
ARG RUST_VERSION=1.95.0
# GPU architectures to compile kernels for, as CMake's CUDAARCHS ("80;86;89;90"); empty:
# llama.cpp's default list for this CUDA version (several, PTX included). Never "native":
# the build machine need not have a GPU.
ARG CUDA_ARCHITECTURES=
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
       ca-certificates curl build-essential cmake clang libclang-dev pkg-config \
    && rm -rf /var/lib/apt/lists/*
ENV RUSTUP_HOME=/usr/local/rustup \
    CARGO_HOME=/usr/local/cargo \
    PATH=/usr/local/cargo/bin:$PATH
RUN curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs \
    | sh -s -- -y --profile minimal --default-toolchain "${RUST_VERSION}"
WORKDIR /src
COPY . .
# libcuda.so is the driver's, absent from any image: link against the toolkit's stub
# (same soname, libcuda.so.1); at run time the NVIDIA container runtime mounts the
# node's driver library (NVIDIA_DRIVER_CAPABILITIES=compute).
ENV LIBRARY_PATH=/usr/local/cuda/lib64/stubs
RUN if [ -n "${CUDA_ARCHITECTURES}" ]; then export CUDAARCHS="${CUDA_ARCHITECTURES}"; fi \
    && cargo build --release --locked -p halyard --features cuda \
    && objcopy --strip-debug target/release/halyard /halyard \
    && /halyard --version

FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu${UBUNTU_VERSION}
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid 10001 halyard \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /var/lib/halyard --shell /usr/sbin/nologin halyard \
    && install -d -o 10001 -g 10001 /var/lib/halyard
COPY --from=build /halyard /usr/local/bin/halyard
# compute: CUDA (libcuda); utility: nvidia-smi and NVML. The Kubernetes manifests set the
# same, for runtimes that read the pod's environment rather than the image's.
ENV NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
USER 10001:10001
WORKDIR /var/lib/halyard
# Worker checkpoints (--state) and coordinator output (--out) belong here.
VOLUME ["/var/lib/halyard"]
# Metrics (and /healthz, /readyz): coordinator 9464, worker 9465.
EXPOSE 9464 9465
ENTRYPOINT ["/usr/local/bin/halyard"]
CMD ["--help"]

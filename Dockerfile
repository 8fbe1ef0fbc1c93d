# moonrun images. Two targets:
#   docker build --target cpu  -t moonrun:cpu  .   # Debian 12, the CPU backend (the demo model runs anywhere)
#   docker build --target cuda -t moonrun:cuda .   # CUDA 13 on Ubuntu 24.04, Hopper GPUs (sm_90a)
# Run (README.md, docs/deployment.md):
#   docker run --rm -p 8000:8000 moonrun:cpu        # the demo model on :8000
#   docker run --rm --gpus all --ipc=host -p 8000:8000 \
#     -v ~/.cache/huggingface:/root/.cache/huggingface \
#     moonrun:cuda serve moonshotai/Kimi-K3 --host 0.0.0.0 --port 8000
# The image's entrypoint is the moonrun binary: every subcommand (serve, plan, verify,
# bench) works the same way, e.g. `docker run --rm moonrun:cpu plan kimi-k3 --gpu B300 --tp-size 8`.
# SIGTERM (docker stop) drains: give `docker stop -t` more than --shutdown-timeout (30 s).

# ---- build stages ---------------------------------------------------------------------
FROM debian:12 AS build-cpu
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update && apt-get install -y --no-install-recommends \
      build-essential cmake ninja-build pkg-config git ca-certificates \
      nlohmann-json3-dev libcli11-dev libcpp-httplib-dev libboost-dev libssl-dev zlib1g-dev \
      libpcre2-dev libstb-dev libgtest-dev libgmock-dev libbenchmark-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cmake -S . -B /build -G Ninja -DMOONRUN_CUDA=OFF -DCMAKE_BUILD_TYPE=Release \
    && cmake --build /build --target moonrun \
    && mkdir -p /opt/moonrun/bin && cp -r models/moonrun-demo /opt/moonrun/bin/demo-model \
    && cp /build/moonrun /opt/moonrun/bin/moonrun

FROM nvidia/cuda:13.0.1-devel-ubuntu24.04 AS build-cuda
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update && apt-get install -y --no-install-recommends \
      build-essential cmake ninja-build pkg-config git ca-certificates \
      nlohmann-json3-dev libcli11-dev libcpp-httplib-dev libboost-dev libssl-dev zlib1g-dev \
      libpcre2-dev libstb-dev libgtest-dev libgmock-dev libbenchmark-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cmake -S . -B /build -G Ninja -DMOONRUN_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
    && cmake --build /build --target moonrun \
    && mkdir -p /opt/moonrun/bin && cp -r models/moonrun-demo /opt/moonrun/bin/demo-model \
    && cp /build/moonrun /opt/moonrun/bin/moonrun

# ---- runtime stages: the binary, the demo model next to it, the shared libraries it links
# (the distribution's runtime packages of the -dev packages above), curl for HEALTHCHECK.
FROM debian:12-slim AS cpu
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update && apt-get install -y --no-install-recommends \
      libcpp-httplib0.11 libpcre2-8-0 libssl3 zlib1g libbrotli1 ca-certificates curl \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build-cpu /opt/moonrun /opt/moonrun
ENV PATH=/opt/moonrun/bin:$PATH
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=3s --start-period=30s CMD curl -fsS http://127.0.0.1:8000/health || exit 1
ENTRYPOINT ["moonrun"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000", "--served-model-name", "moonrun-demo", "moonshotai/Kimi-K3"]

FROM nvidia/cuda:13.0.1-runtime-ubuntu24.04 AS cuda
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update && apt-get install -y --no-install-recommends \
      libcpp-httplib0.14 libpcre2-8-0 libssl3t64 zlib1g libbrotli1 ca-certificates curl \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build-cuda /opt/moonrun /opt/moonrun
ENV PATH=/opt/moonrun/bin:$PATH
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=3s --start-period=600s CMD curl -fsS http://127.0.0.1:8000/health || exit 1
ENTRYPOINT ["moonrun"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000", "--served-model-name", "moonrun-demo", "moonshotai/Kimi-K3"]

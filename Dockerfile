# gpuha's container image: one binary with every subcommand, on Debian 12,
# running as a non-root user. Build: docker build -t gpuha .
#   docker run --rm gpuha plan /usr/share/doc/gpuha/examples/iiot-edge.yaml
# Stage 1 builds the .deb exactly as `make package` does; stage 2 installs it,
# so the image and the package hold the same files (units aside, unused here).

FROM debian:12 AS build
WORKDIR /src
COPY . .
RUN scripts/install-deps.sh --build \
 && cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPUHA_E2E=OFF \
 && cmake --build /build --target gpuha \
 && cd /build && cpack -B /pkg

FROM debian:12-slim
# curl: the controller's Kubernetes fence hook (deploy/kubernetes) cordons a
# node through the API server with its service account's token.
COPY --from=build /pkg/gpuha_*.deb /tmp/
RUN apt-get update \
 && apt-get install -y --no-install-recommends /tmp/gpuha_*.deb curl ca-certificates \
 && rm -rf /var/lib/apt/lists/* /tmp/gpuha_*.deb
# A fixed non-root user (as distroless images use); the agent's manifest
# raises what it needs (the agent's DaemonSet runs privileged, as NVIDIA's
# node agents do: NVML through the runtime, /dev/kmsg).
USER 65532:65532
# The fixed ports: controller gRPC 7400 and HTTP 7401, agent 7402, router
# data 8080 and admin 8081 (src/common/ports.h, docs/configuration.md).
EXPOSE 7400 7401 7402 8080 8081
ENTRYPOINT ["/usr/bin/gpuha"]
CMD ["--help"]

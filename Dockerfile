# The one image of the chart: the four binaries in /usr/local/bin, run as a
# non-root user on a read-only root filesystem.
#   docker build -t ghcr.io/cloud-controller-manager/ccm:0.1.0 .
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked \
      --bin cloud-gateway --bin node-controller --bin service-controller --bin route-controller

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/cloud-gateway \
                  /src/target/release/node-controller \
                  /src/target/release/service-controller \
                  /src/target/release/route-controller /usr/local/bin/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/cloud-gateway"]

# The one image of the chart: the five binaries in /usr/local/bin (and
# aws-preflight, run before a move from cloud-provider-aws), run as a
# non-root user on a read-only root filesystem.
#   docker build -t ghcr.io/cloud-controller-manager/ccm:0.1.0 .
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked \
      --bin cloud-gateway --bin node-controller --bin service-controller --bin route-controller \
      --bin volume-controller --bin aws-preflight

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/cloud-gateway \
                  /src/target/release/node-controller \
                  /src/target/release/service-controller \
                  /src/target/release/route-controller \
                  /src/target/release/volume-controller \
                  /src/target/release/aws-preflight /usr/local/bin/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/cloud-gateway"]

# The Switchyard image used by config/kubernetes/: the switch, its device
# plugin, the admission webhook and the CNI plugin (copied to the host by an
# init container).
#   docker build -t switchyard:0.1.0 .
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked \
      -p switchyard -p switchyard-cni -p switchyard-device-plugin -p switchyard-webhook

FROM debian:bookworm-slim
# af-xdp uplinks open libxdp (and its XDP programs) at run time.
RUN apt-get update && apt-get install -y --no-install-recommends libxdp1 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/switchyard \
                  /src/target/release/switchyard-cni \
                  /src/target/release/switchyard-device-plugin \
                  /src/target/release/switchyard-webhook \
                  /usr/local/bin/
ENTRYPOINT ["switchyard"]
CMD ["run"]

# The Switchyard image used by config/kubernetes/: the switch, its device
# plugin, the admission webhook, the overlays' node watcher (vtep-sync) and
# the CNI plugin (copied to the host by an init container).
#   docker build -t switchyard:0.1.0 .
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked \
      -p switchyard -p switchyard-device-plugin -p switchyard-webhook \
      -p switchyard-vtep-sync
# The CNI plugin runs in the host's root, with the host's libraries: static.
RUN ./scripts/build-cni.sh /out/switchyard-cni

FROM debian:bookworm-slim
# af-xdp uplinks open libxdp (and its XDP programs) at run time.
RUN apt-get update && apt-get install -y --no-install-recommends libxdp1 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/switchyard \
                  /src/target/release/switchyard-device-plugin \
                  /src/target/release/switchyard-webhook \
                  /src/target/release/switchyard-vtep-sync \
                  /usr/local/bin/
# The init container of config/kubernetes/switchyard.yaml installs it on the
# host as /opt/cni/bin/switchyard, the name the netconf's "type" gives.
COPY --from=build /out/switchyard-cni /usr/local/bin/switchyard-cni
ENTRYPOINT ["switchyard"]
CMD ["run"]

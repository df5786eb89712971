# nats-server from Debian's package binary (staged by deploy/image/stage), FROM scratch,
# non-root. Same arguments as the official `nats` image: the entrypoint is nats-server.
# http-probe (tests/src/bin/http-probe.rs) is its healthcheck, as wget is the official
# image's: `http-probe http://127.0.0.1:8222/healthz`.
#
#   cargo build -p halyard-tests --bin http-probe
#   docker build -f deploy/image/nats.Dockerfile --build-arg PROBE_BIN=target/debug/http-probe -t halyard-nats .
FROM scratch
ARG NATS_SERVER_BIN=deploy/image/staged/bin/nats-server
ARG PROBE_BIN=deploy/image/staged/bin/http-probe
COPY deploy/image/staged/rootfs/ /
COPY --chown=10001:10001 deploy/image/staged/data/nats/ /data/
COPY ${NATS_SERVER_BIN} /usr/local/bin/nats-server
COPY ${PROBE_BIN} /usr/local/bin/http-probe
USER 10001:10001
VOLUME ["/data"]
# clients, routes, monitoring
EXPOSE 4222 6222 8222
ENTRYPOINT ["/usr/local/bin/nats-server"]
CMD ["--jetstream", "--store_dir", "/data", "--http_port", "8222"]

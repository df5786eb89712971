# Prometheus from Debian's package binary (staged by deploy/image/stage), FROM scratch,
# non-root: the local stand-in for `prom/prometheus` in the compose tests.
#
#   docker build -f deploy/image/prometheus.Dockerfile -t halyard-prometheus .
FROM scratch
ARG PROMETHEUS_BIN=deploy/image/staged/bin/prometheus
COPY deploy/image/staged/rootfs/ /
COPY --chown=10001:10001 deploy/image/staged/data/prometheus/ /prometheus/
COPY ${PROMETHEUS_BIN} /bin/prometheus
USER 10001:10001
WORKDIR /prometheus
VOLUME ["/prometheus"]
EXPOSE 9090
ENTRYPOINT ["/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]

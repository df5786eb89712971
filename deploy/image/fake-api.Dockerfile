# fake-api: the fake OpenAI-compatible API of the compose cluster's demos and tests
# (tests/src/bin/fake-api.rs), FROM scratch, non-root.
#
#   cargo build -p halyard-tests --bin fake-api
#   docker build -f deploy/image/fake-api.Dockerfile --build-arg FAKE_API_BIN=target/debug/fake-api -t halyard-fake-api .
FROM scratch
ARG FAKE_API_BIN=deploy/image/staged/bin/fake-api
COPY deploy/image/staged/rootfs/ /
COPY ${FAKE_API_BIN} /usr/local/bin/fake-api
USER 10001:10001
# chat completions, /stats and /healthz
EXPOSE 8080 8081
ENTRYPOINT ["/usr/local/bin/fake-api"]
CMD ["--listen", "0.0.0.0:8080", "--stats-listen", "0.0.0.0:8081"]

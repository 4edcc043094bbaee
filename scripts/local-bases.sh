#!/usr/bin/env bash
# Makes, without any container registry, stand-ins for the two base images the
# Dockerfile builds on, plus a Debian image with curl for test clients:
#
#   idemproxy-local/debian:bookworm             minimal Debian 12 (debootstrap from the
#                                               apt mirror) with ca-certificates and curl
#   idemproxy-local/golang:<go version>         that Debian plus this machine's Go
#                                               toolchain (GOROOT), laid out as the
#                                               official golang image is (/usr/local/go, GOPATH=/go)
#   idemproxy-local/static-debian12:nonroot     FROM scratch with what distroless
#                                               static nonroot has: /etc/passwd and
#                                               /etc/group with nonroot (65532), CA
#                                               certificates, tzdata, netbase files,
#                                               /tmp, /home/nonroot, user 65532
#   idemproxy-local/postgres:15                 that Debian plus Debian's postgresql-15,
#                                               started as the official postgres image is
#                                               (POSTGRES_USER, POSTGRES_PASSWORD or
#                                               POSTGRES_PASSWORD_FILE, POSTGRES_DB, data
#                                               in /var/lib/postgresql/data)
#
# Each image is made once per machine and kept (the first run takes a few
# minutes for debootstrap; later runs take a second). It prints the build
# arguments that select them:
#
#   GO_IMAGE=idemproxy-local/golang:1.26.8
#   RUNTIME_IMAGE=idemproxy-local/static-debian12:nonroot
#   DEBIAN_IMAGE=idemproxy-local/debian:bookworm
#   POSTGRES_IMAGE=idemproxy-local/postgres:15
#
# Usage (as root: debootstrap needs it):
#   eval "$(scripts/local-bases.sh)"
#   docker build --build-arg GO_IMAGE=$GO_IMAGE --build-arg RUNTIME_IMAGE=$RUNTIME_IMAGE -t idemproxy .
#
# Set LOCAL_BASES_REBUILD=1 to make them again; DEBIAN_MIRROR to use another mirror.
set -euo pipefail

# Bump when what the images contain changes: older images are then made again.
# The PostgreSQL stand-in has its own revision, so that changing only it does
# not debootstrap Debian again.
rev=1
postgres_rev=2
label=org.idemproxy.local-bases
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
goroot=${GOROOT:-$(go env GOROOT 2>/dev/null || echo /usr/local/go)}
gover=$("$goroot/bin/go" env GOVERSION)
gover=${gover#go}

debian_image=idemproxy-local/debian:bookworm
go_image=idemproxy-local/golang:$gover
runtime_image=idemproxy-local/static-debian12:nonroot
postgres_image=idemproxy-local/postgres:15

log() { echo "local-bases: $*" >&2; }

# current IMAGE [REV]: true when IMAGE exists and was made by revision REV
# (default $rev) of the script.
current() {
	[[ ${LOCAL_BASES_REBUILD:-} != 1 ]] &&
		[[ $(docker image inspect -f "{{index .Config.Labels \"$label\"}}" "$1" 2>/dev/null) == "${2:-$rev}" ]]
}

make_debian() {
	command -v debootstrap >/dev/null || {
		log "installing debootstrap"
		apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >&2
	}
	local root
	root=$(mktemp -d /var/tmp/idemproxy-rootfs.XXXXXX)
	log "debootstrap bookworm from $mirror (a few minutes, once per machine)"
	debootstrap --variant=minbase --include=ca-certificates,curl,netbase,tzdata \
		bookworm "$root" "$mirror" >&2
	rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
	tar -C "$root" --numeric-owner -c . | docker import \
		--change "LABEL $label=$rev" \
		--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
		--change 'CMD ["bash"]' - "$debian_image" >&2
	rm -rf "$root"
}

make_golang() {
	local ctx
	ctx=$(mktemp -d)
	# The machine's CA bundle, not only Debian's: where TLS to the module proxy is
	# inspected, the machine trusts the inspecting CA and so must the build.
	cp /etc/ssl/certs/ca-certificates.crt "$ctx/"
	cat >"$ctx/Dockerfile" <<EOF
FROM $debian_image
COPY go /usr/local/go
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
ENV GOLANG_VERSION=$gover GOTOOLCHAIN=local GOPATH=/go \\
    PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
WORKDIR /go
LABEL $label=$rev
EOF
	log "adding the Go $gover toolchain from $goroot"
	tar -c -C "$ctx" Dockerfile ca-certificates.crt \
		-C "$(dirname "$goroot")" --transform "s,^$(basename "$goroot"),go," "$(basename "$goroot")" |
		docker build -q -t "$go_image" - >&2
	rm -rf "$ctx"
}

make_runtime() {
	log "making the distroless static nonroot stand-in"
	# The files come from the Debian image, as distroless takes them from
	# Debian's packages (base-files, ca-certificates, netbase, tzdata).
	local tarball
	tarball=$(mktemp)
	docker run --rm -i --network none "$debian_image" sh -eu >"$tarball" <<'EOF'
r=$(mktemp -d)
mkdir -p $r/etc/ssl/certs $r/usr/share $r/home/nonroot $r/root $r/tmp $r/var
cp /etc/ssl/certs/ca-certificates.crt $r/etc/ssl/certs/
cp -a /usr/share/zoneinfo $r/usr/share/
cp /etc/services /etc/protocols /etc/nsswitch.conf $r/etc/
cp -L /etc/os-release $r/etc/os-release
cat >$r/etc/passwd <<P
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
P
cat >$r/etc/group <<G
root:x:0:
nobody:x:65534:
tty:x:5:
staff:x:50:
nonroot:x:65532:
G
chown 65532:65532 $r/home/nonroot
chmod 700 $r/root $r/home/nonroot
chmod 1777 $r/tmp
tar -C $r --numeric-owner -c .
EOF
	docker import \
		--change "LABEL $label=$rev" \
		--change 'USER 65532' \
		--change 'WORKDIR /home/nonroot' \
		--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' \
		"$tarball" "$runtime_image" >&2
	rm -f "$tarball"
}

make_postgres() {
	local ctx
	ctx=$(mktemp -d)
	cat >"$ctx/entrypoint.sh" <<'ENTRYPOINT'
#!/bin/sh
# The official postgres image's contract, in short: a new data directory is
# initialised with POSTGRES_USER, POSTGRES_PASSWORD (or POSTGRES_PASSWORD_FILE,
# a secret file) and POSTGRES_DB, then the server runs as postgres, as PID 1,
# listening on every address.
set -eu
bin=/usr/lib/postgresql/15/bin
if [ -n "${POSTGRES_PASSWORD_FILE:-}" ]; then
	[ -z "${POSTGRES_PASSWORD:-}" ] || { echo "set POSTGRES_PASSWORD or POSTGRES_PASSWORD_FILE, not both" >&2; exit 1; }
	POSTGRES_PASSWORD=$(cat "$POSTGRES_PASSWORD_FILE")
fi
: "${PGDATA:=/var/lib/postgresql/data}" "${POSTGRES_USER:=postgres}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
as_pg() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }
if [ ! -s "$PGDATA/PG_VERSION" ]; then
	mkdir -p "$PGDATA" && chown postgres:postgres "$PGDATA" && chmod 700 "$PGDATA"
	pw=$(mktemp) && chown postgres "$pw"
	printf '%s\n' "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is required}" >"$pw"
	as_pg "$bin/initdb" -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$pw" \
		--auth-local=trust --auth-host=scram-sha-256 >/dev/null
	rm -f "$pw"
	echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
	if [ "$POSTGRES_DB" != postgres ]; then
		echo "CREATE DATABASE \"$POSTGRES_DB\";" | as_pg "$bin/postgres" --single -D "$PGDATA" postgres >/dev/null
	fi
fi
exec setpriv --reuid=postgres --regid=postgres --init-groups "$bin/postgres" -D "$PGDATA" -c listen_addresses='*' "$@"
ENTRYPOINT
	chmod +x "$ctx/entrypoint.sh"
	cat >"$ctx/Dockerfile" <<DOCKERFILE
FROM $debian_image
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql-15 \\
 && pg_dropcluster 15 main && rm -rf /var/lib/apt/lists/* \\
 && mkdir -p /var/run/postgresql && chown postgres:postgres /var/run/postgresql
COPY entrypoint.sh /usr/local/bin/postgres-entrypoint
ENV PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
STOPSIGNAL SIGINT
EXPOSE 5432
ENTRYPOINT ["/usr/local/bin/postgres-entrypoint"]
LABEL $label=$postgres_rev
DOCKERFILE
	log "installing Debian's postgresql-15 into $postgres_image"
	docker build -q -t "$postgres_image" "$ctx" >&2
	rm -rf "$ctx"
}

# One maker at a time per machine: parallel test runs wait for the first.
exec 9>/tmp/idemproxy-local-bases.lock
flock 9
# The other two are made from the Debian image: a new one means new ones.
current "$debian_image" || { make_debian; LOCAL_BASES_REBUILD=1; }
current "$go_image" || make_golang
current "$runtime_image" || make_runtime
current "$postgres_image" "$postgres_rev" || make_postgres
echo "GO_IMAGE=$go_image"
echo "RUNTIME_IMAGE=$runtime_image"
echo "DEBIAN_IMAGE=$debian_image"
echo "POSTGRES_IMAGE=$postgres_image"

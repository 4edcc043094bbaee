// Package imagetest builds the repository's Dockerfile and runs the image the
// way operators run it: with docker, on named volumes and private networks,
// and with docker compose. It has only tests.
//
// Without a registry the Dockerfile is built on stand-in bases made by
// scripts/local-bases.sh (a Debian root filesystem plus this machine's Go
// toolchain for the builder; a FROM-scratch image with distroless static
// nonroot's users and files for the runtime). Where no docker engine answers
// the tests are skipped, unless IDEMPROXY_REQUIRE_DOCKER=1 makes that a
// failure (CI sets it).
package imagetest

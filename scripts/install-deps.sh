#!/usr/bin/env bash
# Installs, with apt-get, whatever build and test dependency is missing.
# MariaDB comes as mariadb-server-core/mariadb-client-core only, so no system
# service is installed or started: tests run their own private server.
set -euo pipefail

#   scripts/install-deps.sh          what building and running needs
#   scripts/install-deps.sh --test   also what the tests need (clang's fuzzer
#                                    runtime, Chromium for the dashboard test,
#                                    promtool from prometheus, python3-setuptools
#                                    and python3-venv for the Python library,
#                                    golang-go for the Go module (clients/go),
#                                    openjdk-17-jdk-headless for the Java library (clients/java); for
#                                    tests/install: systemd-analyze, man, groff, and
#                                    the packaging tools; galera-4 and rsync for the
#                                    cluster of scripts/tp-galera)
#   scripts/install-deps.sh --bench  also what bench/run.sh needs (matplotlib for the plot)
#   scripts/install-deps.sh --peer   also what bench/graphile.sh needs: PostgreSQL (run by
#                                    scripts/tp-postgres; its package's service is kept
#                                    from starting) and, when node or npm is missing,
#                                    Debian's nodejs and npm
#   scripts/install-deps.sh --package  also what scripts/package.sh needs (debhelper, lintian;
#                                    dh-python and pybuild-plugin-pyproject for
#                                    python3-taskpush, python3-build, -setuptools and
#                                    -wheel for the wheel)
packages=(
  gcc meson ninja-build pkg-config python3
  libevent-dev default-libmysqlclient-dev libjansson-dev libcmocka-dev
  libssl-dev openssl libsystemd-dev
  mariadb-server-core mariadb-client-core
)
case "${1:-}" in
  --test) packages+=(clang libclang-rt-14-dev chromium chromium-driver python3-selenium prometheus
                  python3-setuptools python3-venv golang-go openjdk-17-jdk-headless galera-4 rsync
                  systemd man-db groff-base bsdextrautils debhelper dpkg-dev build-essential lintian fakeroot
                  dh-python pybuild-plugin-pyproject python3-all python3-build python3-wheel) ;;
  --bench) packages+=(python3-matplotlib) ;;
  --peer) packages+=(postgresql-15)
          command -v node >/dev/null 2>&1 || packages+=(nodejs)
          command -v npm >/dev/null 2>&1 || packages+=(npm) ;;
  --package) packages+=(debhelper dpkg-dev build-essential lintian fakeroot man-db
                     dh-python pybuild-plugin-pyproject python3-all python3-setuptools
                     python3-build python3-wheel) ;;
  "") ;;
  *) echo "install-deps.sh: unknown argument '$1' (--test, --bench, --peer or --package)" >&2; exit 2 ;;
esac
if [ "${TASKPUSH_EXTRA_PACKAGES:-}" ]; then
  read -r -a extra <<<"$TASKPUSH_EXTRA_PACKAGES"
  packages+=("${extra[@]}")
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq

# prometheus is wanted for promtool only (tests run `promtool check metrics`), and
# postgresql-15 for the private server of scripts/tp-postgres: their packages would start
# a system service. A policy-rc.d that answers 101 ("action
# forbidden") keeps every service from starting during this install; it is removed
# afterwards unless one was there already.
policy=/usr/sbin/policy-rc.d
own_policy=""
case " ${missing[*]} " in
  *" prometheus "* | *" postgresql-15 "*)
    if [ ! -e "$policy" ]; then
      printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
      $sudo chmod 755 "$policy"
      own_policy=1
      trap '$sudo rm -f "$policy"' EXIT
    fi
    ;;
esac
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
if [ "$own_policy" ]; then
  $sudo rm -f "$policy"
  trap - EXIT
fi

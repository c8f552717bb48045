#!/usr/bin/env bash
# Set up a fresh Debian 12 machine (as root) to build, test and run ferry.
#   ./setup.sh                    install packages, then build ferry (and its man page) into ./build
#   ./setup.sh --install          the same, then install ferry, its man page, the shell
#                                 completions and the built-in jobs under /usr/local
#                                 (cmake --install build)
#   ./setup.sh --install --prefix DIR    ... under DIR instead (DIR/bin/ferry)
#   ./setup.sh --tests            install packages, build everything into ./build: ferry, the
#                                 unit tests, the fuzzers and the benchmark tools (for ctest)
#   ./setup.sh --sanitize         --tests, and also build ./build-asan with AddressSanitizer + UBSan
#   ./setup.sh --deps             install packages only
# Every dependency is a Debian 12 package; nothing is downloaded from anywhere else.
set -euo pipefail
cd "$(dirname "$0")"

mode=ferry
prefix=/usr/local
prefix_given=
while (($#)); do
  case $1 in
  --deps | --install | --tests | --sanitize) mode=${1#--} ;;
  --prefix)
    (($# >= 2)) || { echo "setup.sh: --prefix needs a directory" >&2; exit 2; }
    prefix=$2
    prefix_given=1
    shift
    ;;
  *)
    echo "setup.sh: unknown option $1; see the top of setup.sh for what it takes" >&2
    exit 2
    ;;
  esac
  shift
done

if [ -n "$prefix_given" ] && [ "$mode" != install ]; then
  echo "setup.sh: --prefix goes with --install" >&2
  exit 2
fi

packages=(
  build-essential cmake pkg-config git ca-certificates
  libssh-dev libboost-dev libboost-filesystem-dev libfmt-dev catch2
  nlohmann-json3-dev libcli11-dev libsqlite3-dev libtomlplusplus-dev
  openssh-server openssh-client zsh fish tcsh dash bash python3 hyperfine procps
  clang libclang-rt-14-dev clang-format clang-tidy iproute2 ansible-core time pssh clustershell
  slurmctld slurmd slurm-client munge slurmdbd mariadb-server-core mount
)
# The `ferry mcp` tests drive it with the MCP TypeScript SDK client on Node.js (the pinned SDK
# is installed by `npm ci` in a ctest fixture). A Node.js that is there already (with its own
# npm) is kept: Debian's npm package would conflict with it.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  packages+=(nodejs npm)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup.sh: missing packages: ${missing[*]}; run this script as root (or install them with apt-get)" >&2
    exit 2
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

[ "$mode" = deps ] && exit 0

cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
case $mode in
ferry | install)
  # Only what `ferry` runs, and what `cmake --install` puts beside it: no tests, no bench tools.
  cmake --build build -j "$(nproc)" --target ferry ferry_man
  if [ "$mode" = install ]; then
    cmake --install build --prefix "$prefix"
  fi
  ;;
tests | sanitize)
  cmake --build build -j "$(nproc)"
  if [ "$mode" = sanitize ]; then
    cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DFERRY_SANITIZE=ON >/dev/null
    cmake --build build-asan -j "$(nproc)"
  fi
  ;;
esac

#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs what building and testing kvxfer needs on a Debian machine, skipping what is there.
# Usage: scripts/deps.sh [extra Debian packages...]
set -euo pipefail

# iproute2 (ip, tc) and nftables (nft): the soak's network faults (docs/stress.md).
want=(build-essential pkg-config cmake libucx-dev ucx-utils iproute2 nftables "$@")
missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep 'install ok installed' >/dev/null || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing Debian packages: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
command -v go >/dev/null || { echo "deps: Go 1.26 is required (https://go.dev/dl)"; exit 1; }
go mod download

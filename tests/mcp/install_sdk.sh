#!/bin/sh
# ctest fixture mcp_sdk_install: the MCP TypeScript SDK exactly as package-lock.json pins it,
# installed with `npm ci` into DIR (the build's copy of this directory).
set -eu
dir=${1:?usage: install_sdk.sh DIR}
for tool in node npm; do
  command -v "$tool" >/dev/null 2>&1 || {
    echo "mcp tests: $tool is missing; run ./setup.sh as root (Debian packages nodejs and npm)" >&2
    exit 1
  }
done
cd "$dir"
npm ci --no-audit --no-fund --prefer-offline
node -e 'import("@modelcontextprotocol/sdk/client/index.js").then(() => console.log("mcp sdk: ok"))'

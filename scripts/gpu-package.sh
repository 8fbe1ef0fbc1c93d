#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh --prebuilt needs to run on a GPU machine that has the CUDA
# runtime but none of the -dev packages, node or npm: the stripped binaries of a CUDA build,
# the shared libraries they need beyond CUDA and glibc, node and the e2e node_modules.
#   scripts/gpu-package.sh BUILD_DIR OUT_DIR
set -euo pipefail
BUILD=$1
DEST=$2
mkdir -p "$DEST/bin" "$DEST/lib" "$DEST/node"
strip -o "$DEST/bin/moonrun" "$BUILD/moonrun"
strip -o "$DEST/bin/moonrun_ops_tests" "$BUILD/tests/moonrun_ops_tests"
# Libraries from Debian packages that a CUDA image lacks (cuBLAS and the CUDA runtime are there).
for lib in $(ldd "$BUILD/moonrun" | awk '/=> \// {print $3}'); do
  case $(basename "$lib") in
    libcpp-httplib*|libbrotli*|libpcre2*|libssl*|libcrypto*|libz.so*) cp -L "$lib" "$DEST/lib/" ;;
    # ZeroMQ (the multi-node control plane) and what it pulls in.
    libzmq*|libsodium*|libpgm*|libnorm*|libgssapi_krb5*|libkrb5*|libk5crypto*|libcom_err*|libkeyutils*|libbsd*|libmd.so*)
      cp -L "$lib" "$DEST/lib/" ;;
  esac
done
if command -v node >/dev/null; then
  # xz: node is ~100 MB, over the 64 MiB a device call may carry.
  xz -T2 -6 -c "$(command -v node)" >"$DEST/node/node.xz"
  E2E=$(cd "$(dirname "$0")/../tests/e2e" && pwd)
  if [[ ! -d $E2E/node_modules ]]; then (cd "$E2E" && npm ci --no-audit --no-fund >/dev/null); fi
  # The coding agents (Claude Code, Codex: ~800 MB of binaries) are for the CPU e2e tests
  # only: gpu-check's e2e files do not run them, and a device call carries 64 MiB.
  tar -czf "$DEST/node/node_modules.tar.gz" -C "$E2E" --exclude='node_modules/@anthropic-ai/claude-code' \
    --exclude='node_modules/@openai/codex*' node_modules
fi
du -sh "$DEST"

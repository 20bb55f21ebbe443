#!/usr/bin/env bash
# Build the real gpu_worker/Dockerfile with buildah (daemonless, unprivileged storage, chroot isolation) over a locally
# made stand-in for its base, then import the worker in the built image. Part 4 of `make image-check`; skips (exit 0,
# saying why) without buildah (`apt-get install buildah`).
#
# The stand-in for vllm/vllm-openai:<pinned version> holds what the Dockerfile's steps use of the base: /bin/sh, a
# Python (this machine's, copied with its standard library and the shared libraries it loads, no site-packages) as
# python3 on the PATH, and uv. It is tagged with the base's name, so the Dockerfile is built unchanged (--pull-never):
# BuildKit's own reading of the ignore file beside the Dockerfile is buildah's too ("filtered out using
# gpu_worker/Dockerfile.dockerignore"), and the RUN installs the lock with uv --require-hashes from PyPI. What it
# cannot show: vLLM, CUDA and the base's Python version (3.12 in vLLM's image; the stand-in's is this machine's).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null || PYTHON=python3
if ! command -v buildah >/dev/null; then
  echo "SKIP  the real Dockerfile built with buildah  -- buildah is not installed (apt-get install buildah)"
  exit 0
fi
VERSION="$(sed -n 's/^ARG VLLM_VERSION=//p' "$ROOT/gpu_worker/Dockerfile")"
BASE="docker.io/vllm/vllm-openai:$VERSION"
TAG="localhost/async-inference-worker:image-check"
BUILDAH=(buildah --storage-driver vfs)
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# The stand-in's root file system.
rootfs="$WORK/context/rootfs"
prefix="$("$PYTHON" -c 'import sys; print(sys.base_prefix)')"
version="$("$PYTHON" -c 'import sys; print(f"{sys.version_info.major}.{sys.version_info.minor}")')"
uv="$(command -v uv || echo "$ROOT/.venv/bin/uv")"
uv="$(readlink -f "$uv")"
mkdir -p "$rootfs$prefix" "$rootfs/usr/local/bin" "$rootfs/bin" "$rootfs/etc/ssl/certs" "$rootfs/tmp"
(cd "$prefix" && tar --exclude="./lib/python$version/site-packages/*" --exclude=__pycache__ \
  --exclude="./lib/python$version/test" -cf - .) | (cd "$rootfs$prefix" && tar -xf -)
python="$(readlink -f "$prefix/bin/python$version")"
ln -sf "$python" "$rootfs/usr/local/bin/python3"
cp /bin/dash "$rootfs/bin/sh"
cp "$uv" "$rootfs/usr/local/bin/uv"
cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/"
for binary in /bin/dash "$uv" "$python" "$prefix"/lib/python"$version"/lib-dynload/*.so; do
  ldd "$binary" 2>/dev/null | grep -o '/[^ ]*\.so[^ ]*' || true
done | sort -u | while read -r library; do
  mkdir -p "$rootfs$(dirname "$library")"
  cp -L "$library" "$rootfs$library"
done
cat >"$WORK/Standin.Dockerfile" <<EOF
FROM scratch
COPY rootfs/ /
ENV PATH=/usr/local/bin:/usr/bin:/bin SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt UV_NATIVE_TLS=1
EOF
"${BUILDAH[@]}" bud --quiet --isolation chroot -f "$WORK/Standin.Dockerfile" -t "$BASE" "$WORK/context" >/dev/null

# The real Dockerfile, from the repository root, as `cdk deploy` builds the staged asset.
started=$SECONDS
if ! "${BUILDAH[@]}" bud --pull-never --network host --isolation chroot -f gpu_worker/Dockerfile -t "$TAG" \
  "$ROOT" >"$WORK/build.log" 2>&1; then
  tail -20 "$WORK/build.log"
  echo "FAIL  the real Dockerfile built with buildah over a stand-in base"
  exit 1
fi
echo "PASS  the real Dockerfile built with buildah over a stand-in base  -- in $((SECONDS - started)) s"

# The built image's Python imports the worker (all but vLLM itself, which the stand-in lacks).
container="$("${BUILDAH[@]}" from --pull-never "$TAG")"
trap '"${BUILDAH[@]}" rm "$container" >/dev/null; "${BUILDAH[@]}" rmi "$TAG" >/dev/null; rm -rf "$WORK"' EXIT
if "${BUILDAH[@]}" run --isolation chroot "$container" -- python3 -c \
  'import gpu_worker.__main__, gpu_worker.worker, async_inference_client; print("imports ok")'; then
  echo "PASS  the built image imports the worker"
else
  echo "FAIL  the built image imports the worker"
  exit 1
fi

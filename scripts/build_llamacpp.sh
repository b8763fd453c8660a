#!/usr/bin/env bash
# Build llama.cpp's test-backend-ops, test-llama-archs and ggml-rpc-server from the llama-cpp-python 0.3.36 sdist
# (ggml 0.25.3, RPC protocol 7.0.0), with the portable profile every llama.cpp golden assumes and -DGGML_RPC=ON.
# test-backend-ops gets scripts/patches/test-backend-ops-rpc-servers.patch: RPC servers named in
# GGML_RPC_SERVERS=host:port[,...] join its device list (RPC0, RPC1, ...).
# The build is cached outside the repo, keyed by version, flags and patch: $REFIMPL_CACHE/build/llama.cpp-<key>/.
# Prints the directory holding the binaries on its last line.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${REFIMPL_CACHE:-$HOME/.cache/refimpl}"
version=0.3.36
flags="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AMX_TILE=OFF \
-DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DGGML_LLAMAFILE=ON -DGGML_RPC=ON -DGGML_OPENMP=OFF -DLLAMA_BUILD_TESTS=ON \
-DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF -DCMAKE_BUILD_TYPE=Release"
patch_file="$here/patches/test-backend-ops-rpc-servers.patch"
key="$(printf '%s\n%s\n' "$version" "$flags" | cat - "$patch_file" | sha1sum | cut -c1-12)"
root="$cache/build/llama.cpp-$version-$key"
bin="$root/build/bin"
targets=(test-backend-ops test-llama-archs ggml-rpc-server)
if [ -f "$root/.built" ]; then echo "$bin"; exit 0; fi
sdist="$cache/sdist/llama_cpp_python-$version.tar.gz"
if [ ! -f "$sdist" ]; then
  mkdir -p "$cache/sdist"
  python3 -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: "llama-cpp-python==$version" \
    -d "$cache/sdist" >&2
fi
rm -rf "$root" && mkdir -p "$root/src"
src="$root/src"
tar xzf "$sdist" -C "$src" --strip-components=3 "llama_cpp_python-$version/vendor/llama.cpp"
(cd "$src" && patch -p1 --forward --quiet < "$patch_file")
echo "building ${targets[*]} in $root (portable profile, RPC on; a few minutes on 2 cores)" >&2
# shellcheck disable=SC2086
cmake -S "$src" -B "$root/build" $flags >"$root/configure.log" 2>&1 || { tail -30 "$root/configure.log" >&2; exit 1; }
cmake --build "$root/build" -j "$(nproc)" --target "${targets[@]}" >"$root/build.log" 2>&1 \
  || { tail -30 "$root/build.log" >&2; exit 1; }
touch "$root/.built"
echo "$bin"

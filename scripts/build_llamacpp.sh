#!/usr/bin/env bash
# Build llama.cpp's test-backend-ops (and, for the portable profile, test-llama-archs and ggml-rpc-server) from the
# llama-cpp-python 0.3.36 sdist (ggml 0.25.3, RPC protocol 7.0.0) with -DGGML_RPC=ON.
#
#   bash scripts/build_llamacpp.sh [--profile portable|native|blas|vulkan] [--cached] [--libllama]
#
# --cached: build nothing; print the directory if that profile's build is cached, else exit 3.
# --libllama: also build libllama and its ggml as shared libraries with the profile's flags (a second build tree
#   beside the first, build-shared/); print the directory holding libllama.so, for LLAMA_CPP_LIB_PATH (`refimpl
#   conformance -b BACKEND --model` runs llama.cpp through llama-cpp-python on that build).
# portable (default): the AVX2 profile every llama.cpp golden assumes (llama-cpp-python's flags, AMX off);
# native: ggml-cpu for this machine's own ISA (-DGGML_NATIVE=ON: AVX-512 where the CPU has it);
# blas: portable plus ggml-blas on OpenBLAS (Debian's libopenblas-dev);
# vulkan: portable plus ggml-vulkan, to run on Mesa's lavapipe (Debian's mesa-vulkan-drivers, libvulkan1 and glslc).
#   ggml 0.25.3's Vulkan code needs newer Vulkan and SPIR-V headers than Debian 12's: Debian 13's libvulkan-dev and
#   spirv-headers are downloaded (apt-get download from a trixie source kept in the cache) and unpacked into
#   $REFIMPL_CACHE/vulkan-headers with dpkg -x, never installed. Its shaders take tens of minutes on 2 cores.
# test-backend-ops gets two patches: test-backend-ops-rpc-servers.patch (RPC servers named in
# GGML_RPC_SERVERS=host:port[,...] join its device list as RPC0, RPC1, ...) and test-backend-ops-judge.patch (with
# GGML_JUDGE_REF=<device> every case is also computed by that reference, on the same inputs, and each case's errors
# against it are written as JSON lines: `refimpl conformance` reads them).
# The build is cached outside the repo, keyed by version, flags and patches: $REFIMPL_CACHE/build/llama.cpp-<key>/.
# Prints the directory holding the binaries on its last line.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${REFIMPL_CACHE:-$HOME/.cache/refimpl}"
profile=portable cached_only="" libllama=""
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) profile="${2:-}"; shift 2 ;;
    --cached) cached_only=1; shift ;;
    --libllama) libllama=1; shift ;;
    *) echo "build_llamacpp.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
version=0.3.36
isa="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AMX_TILE=OFF \
-DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
rest="-DGGML_LLAMAFILE=ON -DGGML_RPC=ON -DGGML_OPENMP=OFF -DLLAMA_BUILD_TESTS=ON \
-DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF -DCMAKE_BUILD_TYPE=Release"
targets=(test-backend-ops)
case "$profile" in
  portable) flags="$isa $rest"; targets=(test-backend-ops test-llama-archs ggml-rpc-server) ;;
  native) flags="-DGGML_NATIVE=ON $rest" ;;
  blas)
    if ! compgen -G "/usr/include/cblas.h" >/dev/null && ! compgen -G "/usr/include/*/cblas.h" >/dev/null; then
      echo "build_llamacpp.sh: ggml-blas needs OpenBLAS's headers: apt-get install libopenblas-dev" >&2; exit 1
    fi
    flags="$isa $rest -DGGML_BLAS=ON -DGGML_BLAS_VENDOR=OpenBLAS" ;;
  vulkan)
    for tool in glslc; do
      command -v "$tool" >/dev/null || { echo "build_llamacpp.sh: ggml-vulkan needs $tool: apt-get install glslc" >&2; exit 1; }
    done
    # the system's loader, in its multiarch directory (chromium ships a private copy in /usr/lib/chromium/, which
    # a /usr/lib/*/ glob picked first once chromium was installed, changing the build's key)
    loader="$(ls /usr/lib/*-linux-gnu*/libvulkan.so.1 2>/dev/null | head -1)"
    [ -n "$loader" ] || { echo "build_llamacpp.sh: no Vulkan loader: apt-get install libvulkan1 mesa-vulkan-drivers" >&2; exit 1; }
    hdr="$cache/vulkan-headers"
    flags="$isa $rest -DGGML_VULKAN=ON -DVulkan_INCLUDE_DIR=$hdr/root/usr/include -DVulkan_LIBRARY=$loader \
-DSPIRV-Headers_DIR=$hdr/root/usr/share/cmake/SPIRV-Headers" ;;
  *) echo "build_llamacpp.sh: unknown profile '$profile' (portable, native, blas, vulkan)" >&2; exit 2 ;;
esac
patches=("$here/patches/test-backend-ops-rpc-servers.patch" "$here/patches/test-backend-ops-judge.patch")
key="$(printf '%s\n%s\n' "$version" "$flags" | cat - "${patches[@]}" | sha1sum | cut -c1-12)"
root="$cache/build/llama.cpp-$version-$key"
bin="$root/build/bin"
if [ -n "$libllama" ]; then bin="$root/build-shared/bin"; fi
marker="$root/.built${libllama:+-shared}"
if [ -f "$marker" ]; then echo "$bin"; exit 0; fi
if [ -n "$cached_only" ]; then echo "build_llamacpp.sh: the $profile build${libllama:+ of libllama} is not cached ($root)" >&2; exit 3; fi
if [ -n "$libllama" ]; then
  if [ ! -f "$root/.built" ]; then
    bash "$0" --profile "$profile" >/dev/null || exit 1
  fi
  echo "building libllama (shared) in $root/build-shared ($profile profile; minutes on 2 cores)" >&2
  # shellcheck disable=SC2086
  cmake -S "$root/src" -B "$root/build-shared" ${flags/-DBUILD_SHARED_LIBS=OFF/-DBUILD_SHARED_LIBS=ON} \
    >"$root/configure-shared.log" 2>&1 \
    || { echo "build_llamacpp.sh: configuring failed: see $root/configure-shared.log" >&2; exit 1; }
  if [ "$profile" = vulkan ]; then
    # the shaders (tens of minutes of glslc) are the static build's: the generator is built, then its outputs
    # are copied with their depfiles and made newer than it, so that make takes them as up to date
    vk_old="$root/build/ggml/src/ggml-vulkan" vk_new="$root/build-shared/ggml/src/ggml-vulkan"
    cmake --build "$root/build-shared" -j "$(nproc)" --target vulkan-shaders-gen >"$root/build-shared.log" 2>&1 \
      || { echo "build_llamacpp.sh: building vulkan-shaders-gen failed: see $root/build-shared.log" >&2; exit 1; }
    cp -a "$vk_old"/*.comp.cpp "$vk_old"/*.comp.cpp.d "$vk_old/ggml-vulkan-shaders.hpp" "$vk_old/vulkan-shaders.spv" \
      "$vk_new/"
    sed -i "s#$root/build/#$root/build-shared/#g" "$vk_new"/*.comp.cpp.d
    touch "$vk_new"/vulkan-shaders.spv/* "$vk_new/ggml-vulkan-shaders.hpp" "$vk_new"/*.comp.cpp
  fi
  cmake --build "$root/build-shared" -j "$(nproc)" --target llama >>"$root/build-shared.log" 2>&1 \
    || { tail -30 "$root/build-shared.log" >&2; echo "build_llamacpp.sh: building failed: see $root/build-shared.log" >&2; exit 1; }
  touch "$marker"
  echo "$bin"
  exit 0
fi
if [ "$profile" = vulkan ]; then
  if [ ! -f "$hdr/.unpacked" ]; then
    echo "downloading Debian 13's libvulkan-dev and spirv-headers (headers only) into $hdr" >&2
    rm -rf "$hdr" && mkdir -p "$hdr/apt/lists/partial" "$hdr/apt/cache/archives/partial" "$hdr/debs" "$hdr/root"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" \
      >"$hdr/sources.list"
    apt_o=(-o "Dir::Etc::SourceList=$hdr/sources.list" -o Dir::Etc::SourceParts=/dev/null
           -o "Dir::State::Lists=$hdr/apt/lists" -o "Dir::Cache=$hdr/apt/cache" -o Debug::NoLocking=1)
    apt-get "${apt_o[@]}" update >"$hdr/apt.log" 2>&1 \
      && (cd "$hdr/debs" && apt-get "${apt_o[@]}" download libvulkan-dev spirv-headers >>"$hdr/apt.log" 2>&1) \
      || { echo "build_llamacpp.sh: downloading the Vulkan headers failed: see $hdr/apt.log" >&2; exit 1; }
    for deb in "$hdr"/debs/*.deb; do dpkg -x "$deb" "$hdr/root"; done
    touch "$hdr/.unpacked"
  fi
fi
sdist="$cache/sdist/llama_cpp_python-$version.tar.gz"
if [ ! -f "$sdist" ]; then
  mkdir -p "$cache/sdist"
  python3 -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: "llama-cpp-python==$version" \
    -d "$cache/sdist" >&2
fi
rm -rf "$root" && mkdir -p "$root/src"
src="$root/src"
tar xzf "$sdist" -C "$src" --strip-components=3 "llama_cpp_python-$version/vendor/llama.cpp"
for p in "${patches[@]}"; do (cd "$src" && patch -p1 --forward --quiet < "$p"); done
echo "building ${targets[*]} in $root ($profile profile, RPC on; minutes on 2 cores, tens of them for vulkan's shaders)" >&2
# shellcheck disable=SC2086
cmake -S "$src" -B "$root/build" $flags >"$root/configure.log" 2>&1 \
  || { tail -30 "$root/configure.log" >&2; echo "build_llamacpp.sh: configuring failed: see $root/configure.log" >&2; exit 1; }
cmake --build "$root/build" -j "$(nproc)" --target "${targets[@]}" >"$root/build.log" 2>&1 \
  || { tail -30 "$root/build.log" >&2; echo "build_llamacpp.sh: building failed: see $root/build.log" >&2; exit 1; }
touch "$root/.built"
echo "$bin"

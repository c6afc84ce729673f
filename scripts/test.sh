#!/usr/bin/env bash
# Runs exactly what CI runs: installs what is missing on a fresh Debian machine, then
# `cargo fmt --check`, `cargo clippy --workspace --all-targets -- -D warnings`, heapscope-wgpu checked without
# its `vulkan` feature, the fuzz targets run for a minute from their seeds (scripts/fuzz.sh), `cargo test --workspace`, and the
# docs built with warnings denied.
#
# System packages (only when missing): the Vulkan loader, Mesa's lavapipe from bookworm-backports
# (Mesa 25.x: sparse binding; bookworm's own Mesa 22 has none), vulkan-tools, the Khronos validation
# layers, Xvfb, a C++ compiler (g++: vk-mem builds VMA's C++ for heapscope-vulkan's `vma` contender) and
# python3 (the pickle cross-checks), fontconfig and a CJK font (fonts-wqy-microhei: what egui's fonts lack draws with
# the system's). Where lavapipe is present afterwards, HEAPSCOPE_REQUIRE_GPU=1 is exported
# so that tests needing Vulkan fail instead of skipping. In CI (CI=true, as .ci/run sets it) a missing lavapipe,
# python3 or CJK font after the install, or UPDATE_SNAPSHOTS set, fails the run. Set HEAPSCOPE_SKIP_INSTALL=1 to install
# nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[test.sh] %s\n' "$*" >&2; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"
    elif command -v sudo >/dev/null 2>&1; then sudo "$@"
    else return 1
    fi
}

debian_codename() {
    # shellcheck disable=SC1091
    (. /etc/os-release 2>/dev/null && printf '%s' "${VERSION_CODENAME:-}")
}

missing_packages() {
    local pkg
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || printf '%s\n' "$pkg"
    done
}

lavapipe_present() {
    compgen -G '/usr/share/vulkan/icd.d/lvp_icd*.json' >/dev/null
}

# Mesa from backports is new enough for sparse binding once its version is 23 or later.
mesa_vulkan_new_enough() {
    local version
    version=$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null) || return 1
    [ "${version%%.*}" -ge 23 ] 2>/dev/null
}

install_system_packages() {
    if [ "${HEAPSCOPE_SKIP_INSTALL:-0}" = 1 ]; then
        log "HEAPSCOPE_SKIP_INSTALL=1: installing nothing"
        return
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        log "no apt-get: install libvulkan1, mesa-vulkan-drivers (Mesa >= 23), vulkan-tools, vulkan-validationlayers, xvfb, g++, python3, fontconfig and a CJK font by hand"
        return
    fi
    # fontconfig and a CJK font: the app and its renders draw what egui's fonts lack with the system's fonts.
    local base=(libvulkan1 vulkan-tools vulkan-validationlayers xvfb g++ python3 fontconfig fonts-wqy-microhei)
    local missing
    missing=$(missing_packages "${base[@]}")
    if [ -z "$missing" ] && mesa_vulkan_new_enough; then
        return
    fi
    local codename
    codename=$(debian_codename)
    local backports=()
    if [ "$codename" = bookworm ]; then
        if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
            log "adding the bookworm-backports suite to apt sources"
            printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
                | as_root tee /etc/apt/sources.list.d/heapscope-backports.sources >/dev/null \
                || { log "cannot write apt sources (not root, no sudo): skipping system packages"; return; }
        fi
        backports=(-t bookworm-backports)
    fi
    log "installing system packages: ${base[*]} mesa-vulkan-drivers ${backports[*]}"
    as_root apt-get update -qq || { log "apt-get update failed: skipping system packages"; return; }
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${backports[@]}" mesa-vulkan-drivers "${base[@]}" >/dev/null \
        || log "apt-get install failed: tests that need Vulkan will skip (and without g++ heapscope-vulkan does not build)"
}

install_rust_components() {
    local component
    for component in rustfmt clippy; do
        if ! rustup component list --installed 2>/dev/null | grep -q "^${component}"; then
            log "adding rustup component ${component}"
            rustup component add "$component"
        fi
    done
}

main() {
    if [ "${1:-}" = --install-only ]; then
        install_system_packages
        return
    fi
    install_system_packages
    install_rust_components
    if lavapipe_present && mesa_vulkan_new_enough; then
        export HEAPSCOPE_REQUIRE_GPU=1
        log "lavapipe found: HEAPSCOPE_REQUIRE_GPU=1 (Vulkan tests fail instead of skipping)"
    elif [ "${CI:-}" = true ]; then
        # A green CI must mean the device tests ran: a failed install is a failed run, not ~90 skips.
        log "CI: no lavapipe with sparse support after the install: failing (the device tests would only skip)"
        exit 1
    else
        log "no lavapipe with sparse support: Vulkan tests skip"
    fi
    if [ "${CI:-}" = true ] && ! fc-list :lang=zh file 2>/dev/null | grep -q .; then
        log "CI: fontconfig knows no font for Chinese (fonts-wqy-microhei): failing (the system-font test would only skip)"
        exit 1
    fi
    if [ "${CI:-}" = true ] && ! command -v python3 >/dev/null 2>&1; then
        log "CI: python3 is missing (the pickle cross-checks need it): failing"
        exit 1
    fi
    if [ -n "${UPDATE_SNAPSHOTS:-}" ]; then
        if [ "${CI:-}" = true ]; then
            log "CI: UPDATE_SNAPSHOTS is set, which would rewrite the expected images instead of checking them: failing"
            exit 1
        fi
        log "UPDATE_SNAPSHOTS is set: the app's image snapshots are rewritten, not checked"
    fi
    cargo fmt --all --check
    cargo fmt --manifest-path allocator/core/fuzz/Cargo.toml --check
    cargo clippy --workspace --all-targets --locked -- -D warnings
    # heapscope-wgpu without its `vulkan` feature is plain wgpu: it builds without heapscope-vulkan (no ash, no VMA).
    cargo check -p heapscope-wgpu --no-default-features --all-targets --locked
    # The fuzz targets are their own workspace: built with libFuzzer's coverage on the stable compiler and run for
    # 60 s in all (the snapshot reader 40 s from its seeds, the policies 20 s); a crash fails the run.
    scripts/fuzz.sh
    cargo test --workspace --locked
    # The crate docs explain the design: they build with every link resolved.
    RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked
}

main "$@"

#!/usr/bin/env bash
# Builds the fuzz targets of allocator/core/fuzz with libFuzzer's instrumentation on the stable compiler and runs
# each for a bounded time from its committed seeds: what CI runs (scripts/test.sh), and a longer run by hand.
#
#     scripts/fuzz.sh                  # CI: `snapshot` 40 s, `ops` 20 s
#     scripts/fuzz.sh snapshot 600     # one target, ten minutes
#
# cargo-fuzz needs a nightly compiler for its default AddressSanitizer; the targets are safe Rust (the crates
# under test deny unsafe code), so coverage is all libFuzzer needs, and the flags that give it
# (`-Cpasses=sancov-module` and the `-sanitizer-coverage-*` LLVM options, plus `--cfg fuzzing`, as cargo-fuzz
# passes them) work on stable. `--target` keeps them off build scripts and proc macros. Inputs the run finds go
# to a scratch corpus, never into seeds/; a crash is saved under allocator/core/fuzz/artifacts/TARGET/ (ignored
# by git) and fails the script. A run whose coverage stays at 0 (no instrumentation) fails too.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[fuzz.sh] %s\n' "$*" >&2; }

fuzz_dir=allocator/core/fuzz
host=$(rustc -vV | sed -n 's/^host: //p')
flags=(
    -Cpasses=sancov-module
    -Cllvm-args=-sanitizer-coverage-level=4
    -Cllvm-args=-sanitizer-coverage-inline-8bit-counters
    -Cllvm-args=-sanitizer-coverage-pc-table
    -Cllvm-args=-sanitizer-coverage-trace-compares
    --cfg fuzzing
    -Cdebug-assertions
    -Coverflow-checks
)

build() {
    RUSTFLAGS="${flags[*]}" cargo build --manifest-path "$fuzz_dir/Cargo.toml" --release --locked --target "$host" --bins
}

# run TARGET SECONDS
run() {
    local target=$1 seconds=$2
    local binary="$fuzz_dir/target/$host/release/$target"
    local seeds="$fuzz_dir/seeds/$target"
    local scratch artifacts="$fuzz_dir/artifacts/$target"
    scratch=$(mktemp -d)
    mkdir -p "$artifacts"
    local corpora=("$scratch")
    [ -d "$seeds" ] && corpora+=("$seeds")
    if [ -d "$seeds" ]; then log "$target: ${seconds} s from the seeds in $seeds"; else log "$target: ${seconds} s from an empty corpus"; fi
    local output status=0
    output=$("$binary" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$artifacts/" "${corpora[@]}" 2>&1) || status=$?
    rm -rf "$scratch"
    if [ "$status" -ne 0 ]; then
        printf '%s\n' "$output" | tail -n 60 >&2
        log "$target: crashed (exit $status); the input is in $artifacts/"
        return 1
    fi
    local execs coverage
    execs=$(printf '%s\n' "$output" | sed -n 's/^stat::number_of_executed_units: *//p')
    coverage=$(printf '%s\n' "$output" | grep -o 'cov: [0-9]*' | tail -n 1 | sed 's/cov: //')
    log "$target: ${execs:-?} runs, coverage ${coverage:-0} edges, no crash"
    if [ "${coverage:-0}" -eq 0 ]; then
        printf '%s\n' "$output" | tail -n 20 >&2
        log "$target: no coverage: the target is not instrumented"
        return 1
    fi
}

main() {
    build
    if [ $# -gt 0 ]; then
        run "$1" "${2:-60}"
    else
        run snapshot 40
        run ops 20
    fi
}

main "$@"

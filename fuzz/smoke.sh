#!/usr/bin/env bash
# Runs every cargo-fuzz target of fuzz/ briefly (the smoke run tests/run.sh does), or for a
# set time each with FUZZ_SECONDS=N (the longer runs whose exec counts go in the issue notes).
#
#   bash fuzz/smoke.sh                      # -runs=${FUZZ_RUNS:-20000} per target, dev profile
#   FUZZ_SECONDS=180 bash fuzz/smoke.sh     # 3 minutes per target, release profile
#   bash fuzz/smoke.sh predicate            # only the named targets
#
# Only the stable toolchain is installed: RUSTC_BOOTSTRAP=1 lets cargo-fuzz pass its -Z
# flags. `--sanitizer none`: the crates forbid unsafe code, so AddressSanitizer would only add
# build time; libFuzzer still reports panics (including debug-assertion overflow checks,
# which cargo-fuzz enables) and crashes, and saves the input under fuzz/artifacts/.
#
# The smoke run builds in the dev profile (FUZZ_PROFILE=dev): the instrumented release build of
# the manager and devcluster took 12.5 of the test command's 50 minutes on 2 cores, and a smoke
# run needs coverage feedback and panics, not speed. Unoptimised code runs about 40 times
# slower, hence 20,000 inputs per target instead of 200,000. Timed runs (FUZZ_SECONDS) build in
# release (FUZZ_PROFILE=release), where exec/s is what they are for.
set -euo pipefail
cd "$(dirname "$0")"
export RUSTC_BOOTSTRAP=1

if ! command -v cargo-fuzz >/dev/null 2>&1; then
    echo "installing cargo-fuzz (cargo install --locked)..."
    cargo install cargo-fuzz --locked
fi

targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
    mapfile -t targets < <(cargo fuzz list)
fi

# One build for every target (they share all dependencies).
if [[ -n "${FUZZ_SECONDS:-}" ]]; then
    profile=${FUZZ_PROFILE:-release}
    budget=(-max_total_time="$FUZZ_SECONDS")
else
    profile=${FUZZ_PROFILE:-dev}
    # A fixed seed and run count make the smoke run repeatable; the time cap only guards CI.
    budget=(-runs="${FUZZ_RUNS:-20000}" -seed=1 -max_total_time=120)
fi
case $profile in
    dev) build_flags=(--dev --sanitizer none) ;;
    release) build_flags=(--release --sanitizer none) ;;
    *) echo "FUZZ_PROFILE must be dev or release, not '$profile'" >&2; exit 2 ;;
esac

echo "--- building the fuzz targets ($profile profile)"
cargo fuzz build "${build_flags[@]}"

mkdir -p target/smoke-logs
summary=()
for t in "${targets[@]}"; do
    log="target/smoke-logs/$t.log"
    echo "--- fuzz target $t (${budget[*]})"
    if ! cargo fuzz run "${build_flags[@]}" "$t" -- "${budget[@]}" -max_len=4096 >"$log" 2>&1; then
        tail -40 "$log"
        echo "fuzz target $t FAILED (full output: fuzz/$log; crashing input under fuzz/artifacts/$t/)"
        exit 1
    fi
    done_line=$(grep -E '^Done [0-9]+ runs' "$log" | tail -1 || true)
    summary+=("$t: ${done_line:-finished}")
    echo "$t: ${done_line:-finished}"
done

echo "--- fuzz summary"
printf '%s\n' "${summary[@]}"

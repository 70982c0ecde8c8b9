#!/usr/bin/env bash
# Runs every cargo-fuzz target of fuzz/ briefly (the smoke run tests/run.sh does), or for a
# set time each with FUZZ_SECONDS=N (the longer runs whose exec counts go in the issue notes).
#
#   bash fuzz/smoke.sh                      # -runs=${FUZZ_RUNS:-200000} per target
#   FUZZ_SECONDS=180 bash fuzz/smoke.sh     # 3 minutes per target
#   bash fuzz/smoke.sh predicate            # only the named targets
#
# Only the stable toolchain is installed: RUSTC_BOOTSTRAP=1 lets cargo-fuzz pass its -Z
# flags. `--sanitizer none`: the crates forbid unsafe code, so AddressSanitizer would only add
# build time; libFuzzer still reports panics (including debug-assertion overflow checks,
# which cargo-fuzz enables) and crashes, and saves the input under fuzz/artifacts/.
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
cargo fuzz build --sanitizer none

if [[ -n "${FUZZ_SECONDS:-}" ]]; then
    budget=(-max_total_time="$FUZZ_SECONDS")
else
    # A fixed seed and run count make the smoke run repeatable; the time cap only guards CI.
    budget=(-runs="${FUZZ_RUNS:-200000}" -seed=1 -max_total_time=120)
fi

mkdir -p target/smoke-logs
summary=()
for t in "${targets[@]}"; do
    log="target/smoke-logs/$t.log"
    echo "--- fuzz target $t (${budget[*]})"
    if ! cargo fuzz run --sanitizer none "$t" -- "${budget[@]}" -max_len=4096 >"$log" 2>&1; then
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

#!/usr/bin/env bash
# Type-checks and lints the whole workspace (every member, all targets: libs, bins, tests,
# examples, benches) for aarch64-apple-darwin on a machine without an Apple SDK, so code gated on
# `target_vendor = "apple"` (the Core ML backend) is compiled against the real objc2 bindings here.
#
# How: Debian's `rustc-web`, `cargo-web`, `rust-web-src` and `rust-web-clippy` packages give a
# Rust toolchain (/usr/bin/{rustc,cargo,cargo-clippy,clippy-driver}) with the standard library's
# sources (/usr/lib/rustlib/src/rust), so `-Zbuild-std` (nightly-only, allowed by RUSTC_BOOTSTRAP=1)
# builds core/std metadata for the target from source. rustup's toolchain is not used (its rust-src
# component cannot be fetched here). Nothing links and nothing runs: this is a compile check.
#
# Clippy works for the target: it runs `cargo clippy ... -- -D warnings`, which type-checks all that
# `cargo check` would and adds clippy's lints (clippy-driver wraps only workspace members; std and
# dependencies are plain checks). Debian's clippy (1.96) may be newer than the toolchain .ci/run
# lints with and so know more lints. ANEMONE_APPLE_NO_CLIPPY=1 runs plain `cargo check` instead.
#
# Its own target dir (target/apple-check, or $ANEMONE_APPLE_TARGET_DIR) keeps it apart from the
# normal build; the standard library is checked once per target dir, and a rerun with nothing
# changed takes about a second. Dependencies with build scripts that compile C for the target would
# fail here (no Apple SDK): the workspace's features avoid them (tokenizers without default features:
# no onig, and esaxx-rs without its `cpp` feature has an empty build script). Keep it so: e.g.
# objc2's `exception`/`catch-all` features pull objc2-exception-helper, which compiles C.
#
# Installs missing packages with apt-get (needs root, as in CI). Exits non-zero on any error.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET=aarch64-apple-darwin
PKGS=(rustc-web cargo-web rust-web-src rust-web-clippy)
[ "${ANEMONE_APPLE_NO_CLIPPY:-}" = 1 ] && PKGS=(rustc-web cargo-web rust-web-src)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "check-apple.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# Debian's toolchain, not rustup's proxies in ~/.cargo/bin.
export PATH="/usr/bin:$PATH"
export RUSTC=/usr/bin/rustc
export RUSTC_BOOTSTRAP=1
unset RUSTC_WRAPPER RUSTC_WORKSPACE_WRAPPER RUSTUP_TOOLCHAIN CARGO_BUILD_TARGET
export CARGO_TARGET_DIR="${ANEMONE_APPLE_TARGET_DIR:-$PWD/target/apple-check}"
CARGO=/usr/bin/cargo
SRC="$("$RUSTC" --print sysroot)/lib/rustlib/src/rust/library"
[ -f "$SRC/std/Cargo.toml" ] || { echo "check-apple.sh: no standard library sources at $SRC" >&2; exit 1; }
"$RUSTC" --version
"$CARGO" --version

# A check needs no optimized or debug-info host code (build scripts, proc macros): the dev
# profile's opt-level 3 for dependencies only slows this down. (These go after the subcommand:
# cargo does not pass a --config given before it on to an external one such as clippy.)
export CARGO_INCREMENTAL=0
PROFILE=(--config 'profile.dev.opt-level=0' --config 'profile.dev.debug=0'
  --config 'profile.dev.package."*".opt-level=0' --config 'profile.dev.build-override.opt-level=0')
ARGS=(-Zbuild-std --target "$TARGET" --workspace --all-targets --locked)

start=$SECONDS
if [ "${ANEMONE_APPLE_NO_CLIPPY:-}" = 1 ]; then
  echo "check-apple.sh: cargo check ${ARGS[*]} (target dir $CARGO_TARGET_DIR)"
  "$CARGO" check "${PROFILE[@]}" "${ARGS[@]}"
else
  echo "check-apple.sh: cargo clippy ${ARGS[*]} -- -D warnings (target dir $CARGO_TARGET_DIR)"
  "$CARGO" clippy "${PROFILE[@]}" "${ARGS[@]}" -- -D warnings
fi
echo "check-apple.sh: $TARGET clean ($((SECONDS - start)) s)"

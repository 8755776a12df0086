#!/bin/bash
# The real-text corpus of benchmarks/llm_real_text.sh, prepared on a CPU machine with network access to
# Debian's package archive (the GPU machine has none: the prepared tokens travel there as .data/).
#   bash benchmarks/llm_real_text_data.sh            # from the repo root; ~1-2 min; writes .data/realtext/
# Corpus: the reStructuredText sources Sphinx keeps beside the HTML of two Debian documentation packages,
# English only (the kernel's translations/ are left out):
#   linux-doc-6.1   the Linux kernel's Documentation/ (admin guide, process, driver APIs...), ~21.4 MB
#   python3.11-doc  Python's documentation (tutorial, library reference, howtos, what's new), ~11.0 MB
# apt-get download fetches the .deb files only (nothing is installed); dpkg -x unpacks them into a temporary
# directory. The versions used and the .deb sha256 go into .data/realtext/meta.json ("note") beside
# kiln's own record of every text file (path, bytes, sha256).
# Then `kiln data prepare` trains a 16384-token byte-level BPE on the text and writes train.bin / val.bin
# (1% held out, spread over the corpus), meta.json and tokenizer/ (~17 MB in all).
set -euo pipefail
DEST=${DEST:-.data/realtext}
VOCAB=${VOCAB:-16384}
PACKAGES=(linux-doc-6.1 python3.11-doc)
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo "$PWD/.venv/bin/python" || echo python3)}
if [ -e "$DEST" ]; then echo "$DEST exists; remove it first to prepare again" >&2; exit 2; fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
here=$PWD
note=""
( cd "$work" && apt-get download "${PACKAGES[@]}" 2>&1 | grep -v "^W: Download is performed unsandboxed" ) || {
  echo "apt-get download failed: run 'apt-get update' first (needs Debian's archive)" >&2; exit 1; }
for deb in "$work"/*.deb; do
  name=$(dpkg-deb -f "$deb" Package) version=$(dpkg-deb -f "$deb" Version)
  note+="$name $version (sha256 $(sha256sum "$deb" | cut -c1-64)); "
  dpkg -x "$deb" "$work/x"
done
linux=$work/x/usr/share/doc/linux-doc-6.1/html/_sources
python=$(echo "$work"/x/usr/share/doc/python3.11/html/_sources)
rm -rf "$linux/translations"  # Chinese, Japanese, Korean, Italian, Spanish versions: English only
echo "corpus: $note"
du -sh "$linux" "$python"
cd "$here"
mkdir -p "$(dirname "$DEST")"
PYTHONPATH=$here/src:${PYTHONPATH:-} "$PY" -m kiln data prepare "$linux" "$python" --train-bpe "$VOCAB" \
  --val-fraction 0.01 --out "$DEST" \
  --note "Debian packages ${note% } reStructuredText sources (html/_sources), kernel translations/ left out"
du -sh "$DEST"

#!/usr/bin/env bash
# bnb_wheel.sh — the bitsandbytes wheel that travels to the GPU machine (it has
# no network and no bitsandbytes). Run here, where PyPI is reachable:
#
#   bash scripts/bnb_wheel.sh [OUT_DIR]      (default .devpeers/whl, git-ignored)
#
# Downloads bitsandbytes==0.50.2's manylinux x86_64 wheel (pip download
# --no-deps; 43.1 MB, one CUDA library per toolkit and ROCm / XPU ones) and
# repacks it under the same file name keeping only the CUDA 13 libraries
# (libbitsandbytes_cuda130.so, which torch 2.11+cu130 loads, and _cuda132.so)
# and the CPU one, RECORD regenerated: 7.1 MB. The same repack as
# .devpeers/tools/prepare_wheels.sh (which also keeps this version), so the two
# may share the folder. The GPU side installs it with
#   pip install --no-index --no-deps --target /tmp/site OUT_DIR/bitsandbytes-0.50.2-*.whl
# and PYTHONPATH=/tmp/site (scripts/gpu_check.sh, section qlora).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-.devpeers/whl}
PY=${PYTHON:-python3}
PIP=${PIP:-pip}
VERSION=0.50.2
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT

"$PIP" download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$STAGE" "bitsandbytes==$VERSION"
IN=$(ls "$STAGE"/bitsandbytes-$VERSION-*.whl)
mkdir -p "$OUT"
"$PY" - "$IN" "$OUT" <<'EOF'
import base64, fnmatch, hashlib, os, sys, zipfile
src, outdir = sys.argv[1], sys.argv[2]
KEEP = ("bitsandbytes/libbitsandbytes_cuda13*.so", "bitsandbytes/libbitsandbytes_cpu.so")
zin = zipfile.ZipFile(src)
record = [i.filename for i in zin.infolist() if i.filename.endswith(".dist-info/RECORD")]
if len(record) != 1:
    sys.exit(f"{src}: expected one RECORD, found {record}")
record = record[0]
out = os.path.join(outdir, os.path.basename(src))
rows, kept_so = [], []
with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
    for info in zin.infolist():
        n = info.filename
        if n == record or n.endswith("/"):
            continue
        if fnmatch.fnmatch(n, "bitsandbytes/libbitsandbytes_*.so"):
            if not any(fnmatch.fnmatch(n, k) for k in KEEP):
                continue  # another toolkit's library
            kept_so.append(os.path.basename(n))
        data = zin.read(n)
        zi = zipfile.ZipInfo(n, date_time=info.date_time)
        zi.external_attr = info.external_attr
        zout.writestr(zi, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
        h = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows.append(f"{n},sha256={h},{len(data)}")
    rows.append(f"{record},,")
    zi = zipfile.ZipInfo(record, date_time=(2026, 1, 1, 0, 0, 0))
    zi.external_attr = 0o644 << 16
    zout.writestr(zi, "\n".join(rows) + "\n", compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
if not any(s.startswith("libbitsandbytes_cuda130") for s in kept_so):
    sys.exit(f"{src}: no libbitsandbytes_cuda130.so in the wheel")
print(f"{out}: {', '.join(sorted(kept_so))}; {os.path.getsize(src) / 1e6:.1f} MB -> "
      f"{os.path.getsize(out) / 1e6:.1f} MB")
EOF

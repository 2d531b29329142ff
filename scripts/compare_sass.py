#!/usr/bin/env python3
"""compare_sass.py BINARY_A BINARY_B — the GPU code of two ctune builds, kernel by
kernel: the check that a change which only moves or renames files (a refactor of
cuda/) leaves every kernel's machine code as it was.

Each binary's SASS comes from `cuobjdump -sass` (CUDA toolkit); a kernel is one
"Function : NAME" block, compared by its instructions (the text after each
address), so module headers and line-info comments, which name source files,
do not count. Prints one line per kernel that differs or exists in one build only, then a summary.
Exit status: 0 when every kernel is identical, 1 otherwise, 2 on a usage error.
"""
import re
import shutil
import subprocess
import sys


def kernels(binary):
    """{mangled name: normalised SASS text} of one binary."""
    tool = shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump"
    out = subprocess.run([tool, "-sass", binary], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"error: cuobjdump -sass {binary}: {out.stderr.strip() or 'failed'}")
    found, name, body = {}, None, []
    for line in out.stdout.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            if name:
                found[name] = "\n".join(body)
            name, body = m.group(1), []
            continue
        if name is None:
            continue
        # Only instruction lines count: "/*0040*/  IMAD.MOV.U32 R1, RZ, RZ, c[0x0][0x28] ;
        # /* 0x... */" keeps its instruction. Everything else (the next module's
        # "Fatbin elf code" header, which names its source file, line-info
        # comments) may change when a file only moves.
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s*(.*?)\s*(/\* 0x[0-9a-f]+ \*/)?\s*$", line)
        if m and m.group(1):
            body.append(m.group(1))
    if name:
        found[name] = "\n".join(body)
    return found


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        sys.exit(2)
    a, b = kernels(sys.argv[1]), kernels(sys.argv[2])
    same = sorted(k for k in a if k in b and a[k] == b[k])
    differ = sorted(k for k in a if k in b and a[k] != b[k])
    only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    for k in differ:
        print(f"differs   {k}")
    for k in only_a:
        print(f"only in A {k}")
    for k in only_b:
        print(f"only in B {k}")
    print(f"kernels: {len(same)} identical, {len(differ)} differ, {len(only_a)} only in A, {len(only_b)} only in B")
    sys.exit(0 if not differ and not only_a and not only_b and same else 1)


if __name__ == "__main__":
    main()

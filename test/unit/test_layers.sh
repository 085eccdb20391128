#!/usr/bin/env bash
# The library's layers, checked on every include: foundation (llmc/base, llmc/data, llmc/cuda) -> model, comm ->
# optim -> run (llmc/run) -> trainers and tools, and nothing in llmc/ reaches out to test/, dev/ or emu/. A folder may
# include only itself and the folders listed for it below; an optimizer's or a model family's own folder
# (optim/demo, model/gpt2) reaches no sibling's within its layer. Prints every edge that breaks a rule; fails if there is one.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec python3 - <<'PY'
import os, re, sys

# folder -> the folders (besides itself) it may include
ALLOWED = {
    "llmc/base": [],
    "llmc/data": ["llmc/base"],
    "llmc/cuda": ["llmc/base"],
    "llmc/model": ["llmc/base", "llmc/cuda"],
    "llmc/comm": ["llmc/base", "llmc/cuda"],
    "llmc/optim": ["llmc/base", "llmc/cuda", "llmc/model", "llmc/comm"],
    "llmc/run": ["llmc/base", "llmc/data", "llmc/cuda", "llmc/model", "llmc/comm", "llmc/optim"],
    "emu": ["llmc/base"],
}
LAYERS = sorted(ALLOWED, key=len, reverse=True)

def layer_of(path):
    for layer in LAYERS:
        if path == layer or path.startswith(layer + "/"):
            return layer
    return None

def room_of(path):
    """An optimizer's or model family's own folder (llmc/optim/demo), or None for a layer's shared files."""
    parts = path.split("/")
    return "/".join(parts[:3]) if len(parts) > 3 and parts[1] in ("optim", "model") else None

bad, edges, files = [], 0, 0
for top in ("llmc", "emu"):
    for root, _, names in os.walk(top):
        for name in sorted(names):
            if not name.endswith((".h", ".cuh", ".cpp", ".cu")):
                continue
            path = os.path.join(root, name)
            files += 1
            mine, my_room = layer_of(path), room_of(path)
            for n, line in enumerate(open(path, encoding="utf-8"), 1):
                m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                if not m:
                    continue
                target = m.group(1)
                edges += 1
                theirs = layer_of(target)
                if theirs is None:
                    bad.append(f"{path}:{n}: includes {target}, outside the library's layers")
                elif theirs != mine and theirs not in ALLOWED[mine]:
                    bad.append(f"{path}:{n}: {mine} includes {target} ({theirs}, a layer above or beside it)")
                elif theirs == mine and room_of(target) and my_room and room_of(target) != my_room:
                    bad.append(f"{path}:{n}: {my_room} includes {target}, another room's file")
print(f"{files} files, {edges} includes checked")
for b in bad:
    print("FAIL  " + b)
if bad:
    print(f"{len(bad)} include(s) break the layering")
    sys.exit(1)
print("no include reaches a higher layer")
PY

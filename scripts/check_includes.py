#!/usr/bin/env python3
"""Checks the include graph's layers: every project include must point at a folder its own
folder may use. Layers, lowest first:

  common/          the floor: hashing, locking, logging, flags, server plumbing
  cache_service/   the chunk registry          (common)
  gpu_worker/      model, engine, backends     (common, the registry's client)
  services/        tokenizer, gateway, CLI     (common, the registry's client, the worker's
                                                public headers)

so no arrow runs back up and there is no circle. bench/ and tests/ may include anything.

Usage: check_includes.py [ROOT]      exit 1 and list each offending include
       check_includes.py --self-test   proves the rules catch an upward include
"""
import os
import re
import sys

# Generated from proto/: every layer above the floor may use the wire contract.
PROTO = ("cascade/v2/", "grpc/health/")
# What other components may include from the worker: the engine's types, the sampling rules
# and their wire form, the model's config.
WORKER_PUBLIC = (
    "gpu_worker/engine/types.h",
    "gpu_worker/engine/sampler.h",
    "gpu_worker/engine/sampling_wire.h",
    "gpu_worker/model/config.h",
)
REGISTRY_PUBLIC = ("cache_service/client/",)

# Most specific folder first; each maps to the include prefixes it may use.
RULES = [
    ("common/", ("common/", "grpc/health/")),
    ("cache_service/", ("common/", "cache_service/") + PROTO),
    ("gpu_worker/", ("common/", "gpu_worker/") + REGISTRY_PUBLIC + PROTO),
    ("services/tokenizer/", ("common/", "services/tokenizer/")),
    ("services/gateway/", ("common/", "services/gateway/", "services/tokenizer/")
     + REGISTRY_PUBLIC + WORKER_PUBLIC + PROTO),
    ("services/cli/", ("common/", "services/cli/", "services/tokenizer/", "gpu_worker/model/")
     + REGISTRY_PUBLIC + PROTO),
]
# Include prefixes that name project code (anything else is a system or library header).
PROJECT = ("common/", "cache_service/", "gpu_worker/", "services/", "bench/", "tests/") + PROTO
SOURCE = re.compile(r"\.(h|cc|cu|cuh)$")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def rule_for(path):
    for folder, allowed in RULES:
        if path.startswith(folder):
            return allowed
    return None


def violations(files):
    """files: {relative path: text}. Returns 'path: includes X' lines for forbidden includes."""
    out = []
    for path, text in sorted(files.items()):
        allowed = rule_for(path)
        if allowed is None:
            continue
        for inc in INCLUDE.findall(text):
            if not inc.startswith(PROJECT):
                continue
            if not any(inc == a or (a.endswith("/") and inc.startswith(a)) for a in allowed):
                out.append(f"{path}: includes {inc}, which {path.split('/')[0]}/ may not use")
    return out


def read_tree(root):
    files = {}
    for top in ("common", "cache_service", "gpu_worker", "services"):
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            for name in names:
                if SOURCE.search(name):
                    full = os.path.join(dirpath, name)
                    with open(full, encoding="utf-8", errors="replace") as f:
                        files[os.path.relpath(full, root)] = f.read()
    return files


def self_test():
    bad = {
        "common/log.h": '#include "services/gateway/turn.h"\n',
        "cache_service/registry/registry.h": '#include "gpu_worker/engine/engine.h"\n',
        "gpu_worker/engine/engine.cc": '#include "services/tokenizer/tokenizer.h"\n',
        "services/gateway/turn.cc": '#include "gpu_worker/service/worker_service.h"\n',
        "services/tokenizer/bpe.cc": '#include "services/gateway/prompt.h"\n',
    }
    good = {
        "gpu_worker/engine/engine.cc": '#include "common/chunk_hash.h"\n#include <vector>\n',
        "services/gateway/prompt.cc": '#include "gpu_worker/engine/sampling_wire.h"\n'
                                      '#include "cascade/v2/gateway.pb.h"\n',
        "bench/x.cc": '#include "services/gateway/turn.h"\n',
    }
    found = violations(bad)
    assert len(found) == len(bad), found
    assert violations(good) == [], violations(good)
    print("check_includes self-test: ok")


def main(argv):
    if len(argv) > 1 and argv[1] == "--self-test":
        self_test()
        return 0
    root = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    files = read_tree(root)
    bad = violations(files)
    for line in bad:
        print(line)
    if bad:
        print(f"check_includes: {len(bad)} include(s) break the layers (see the docstring of "
              "scripts/check_includes.py); move the shared code down to common/ or include the "
              "component's public header instead")
        return 1
    print(f"check_includes: {len(files)} files, layers hold")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

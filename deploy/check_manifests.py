#!/usr/bin/env python3
"""Checks deploy/ against the real binaries, so a manifest cannot name a flag that does not exist.

For every container that runs a Cascade binary (in the kustomize renderings of base and each
overlay, in raw YAML files given with --file, and in the Dockerfiles' ENTRYPOINT/CMD):
  * each --flag it passes is one that `<binary> --help` lists (`cascade mkmodel --help` for the
    mkmodel init container);
  * each $(VAR) in its args is defined by its env or by a ConfigMap it loads with envFrom
    (Kubernetes would otherwise pass the text "$(VAR)" on unchanged);
  * its gRPC probes use its --port, its Prometheus annotation names its --metrics_port;
  * terminationGracePeriodSeconds covers the preStop sleep plus --drain_timeout.
Exit 0: all good; 1: problems (listed); 77: PyYAML missing (ctest reports a skip).

Usage: check_manifests.py --bin_dir build/bin [--k8s_dir deploy/k8s] [--file extra.yaml ...]
"""
import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys

try:
    import yaml
except ImportError:
    print("check_manifests: PyYAML is not installed (apt-get install python3-yaml); skipping")
    sys.exit(77)

BINARIES = ("cascade-registry", "cascade-worker", "cascade-gateway", "cascade")
HELP_FLAG = re.compile(r"^\s+--([A-Za-z0-9_-]+)\b", re.M)
VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


class Checker:
    def __init__(self, bin_dir):
        self.bin_dir = bin_dir
        self.known = {}  # (binary, subcommand) -> set of flag names
        self.problems = []
        self.checked_flags = 0

    def flags_of(self, binary, subcommand):
        key = (binary, subcommand)
        if key not in self.known:
            path = os.path.join(self.bin_dir, binary)
            cmd = [path] + ([subcommand] if subcommand else []) + ["--help"]
            try:
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            except OSError as e:
                sys.exit(f"check_manifests: cannot run {path}: {e} (build it first)")
            if out.returncode != 0:
                sys.exit(f"check_manifests: {' '.join(cmd)} exited {out.returncode}: {out.stderr}")
            names = set(HELP_FLAG.findall(out.stdout))
            if not names:
                sys.exit(f"check_manifests: no flags found in the output of {' '.join(cmd)}")
            self.known[key] = names
        return self.known[key]

    def problem(self, where, text):
        self.problems.append(f"{where}: {text}")

    def check_args(self, where, command, args):
        """Checks the flag names of one command line; returns {flag: value} of those given."""
        argv = list(command) + list(args)
        if not argv or os.path.basename(argv[0]) not in BINARIES:
            return None
        binary = os.path.basename(argv[0])
        rest = argv[1:]
        subcommand = None
        if binary == "cascade":
            if not rest:
                return None  # the bare tool (an image's ENTRYPOINT): nothing to check yet
            if rest[0].startswith("-"):
                self.problem(where, "`cascade` with flags but no subcommand")
                return None
            subcommand, rest = rest[0], rest[1:]
        known = self.flags_of(binary, subcommand)
        given = {}
        for arg in rest:
            if not arg.startswith("--"):
                self.problem(where, f"'{arg}' is not a --flag (the binaries take no positionals)")
                continue
            name, _, value = arg[2:].partition("=")
            self.checked_flags += 1
            if name not in known and not (name.startswith("no") and name[2:] in known):
                self.problem(where, f"{binary}{' ' + subcommand if subcommand else ''} has no "
                             f"flag --{name} (see `{binary} --help`)")
            given[name] = value
        return given


def parse_duration_s(text):
    """'55s' / '500ms' / '1m30s' / '2h' -> seconds; None if not a duration."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|ns|h|m|s)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    scale = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
    return sum(float(n) * scale[u] for n, u in parts)


def walk_pod_specs(doc):
    """Yields every pod spec in a document (Deployment, StatefulSet, Job, Pod, patches)."""
    if isinstance(doc, dict):
        if "containers" in doc or "initContainers" in doc:
            yield doc
        for v in doc.values():
            yield from walk_pod_specs(v)
    elif isinstance(doc, list):
        for v in doc:
            yield from walk_pod_specs(v)


def check_documents(checker, docs, source, strict_env):
    configmaps = {d["metadata"]["name"]: d.get("data", {}) or {}
                  for d in docs if isinstance(d, dict) and d.get("kind") == "ConfigMap"}
    for doc in docs:
        if not isinstance(doc, dict):
            continue
        name = f"{source}: {doc.get('kind', '?')}/{doc.get('metadata', {}).get('name', '?')}"
        annotations = (doc.get("spec", {}).get("template", {}).get("metadata", {})
                       .get("annotations", {})) if isinstance(doc.get("spec"), dict) else {}
        for pod in walk_pod_specs(doc):
            grace = pod.get("terminationGracePeriodSeconds", 30)
            for c in (pod.get("initContainers") or []) + (pod.get("containers") or []):
                where = f"{name} container {c.get('name', '?')}"
                given = checker.check_args(where, c.get("command") or [], c.get("args") or [])
                if given is None:
                    continue
                # Downward-API and secret values are unknown here; only their names matter.
                env = {e["name"]: e.get("value", "<valueFrom>") for e in c.get("env") or []}
                for ref in c.get("envFrom") or []:
                    cm = (ref.get("configMapRef") or {}).get("name")
                    if cm in configmaps:
                        env.update(configmaps[cm])
                    elif cm and strict_env:
                        checker.problem(where, f"envFrom ConfigMap '{cm}' is not in the rendering")

                def resolve(v):
                    return VAR_REF.sub(lambda m: str(env.get(m.group(1), m.group(0))), v)

                if strict_env:
                    for arg in c.get("args") or []:
                        for var in VAR_REF.findall(arg):
                            if var not in env:
                                checker.problem(where, f"{arg}: $({var}) is defined by neither "
                                                "env nor an envFrom ConfigMap")
                port = resolve(given.get("port", ""))
                for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                    grpc = (c.get(probe) or {}).get("grpc")
                    if grpc and str(grpc.get("port")) != port:
                        checker.problem(where, f"{probe} dials gRPC port {grpc.get('port')}, "
                                        f"but --port={port or '(unset)'}")
                metrics = resolve(given.get("metrics_port", ""))
                scrape = annotations.get("prometheus.io/port")
                if scrape is not None and c in (pod.get("containers") or []) and metrics != scrape:
                    checker.problem(where, f"prometheus.io/port {scrape} but --metrics_port="
                                    f"{metrics or '(unset)'}")
                if "drain_timeout" in given and strict_env:
                    drain = parse_duration_s(resolve(given["drain_timeout"]))
                    if drain is None:
                        checker.problem(where, f"--drain_timeout={resolve(given['drain_timeout'])}"
                                        " is not a duration")
                        continue
                    pre = ((c.get("lifecycle") or {}).get("preStop") or {}).get("exec", {})
                    cmd = pre.get("command") or []
                    pre_s = float(cmd[1]) if len(cmd) == 2 and cmd[0] == "sleep" else 0.0
                    if grace < pre_s + drain:
                        checker.problem(where, f"terminationGracePeriodSeconds {grace} < preStop "
                                        f"sleep {pre_s:g} s + --drain_timeout {drain:g} s: the "
                                        "kubelet would kill it mid-drain")


def check_dockerfiles(checker, deploy_dir):
    for path in sorted(glob.glob(os.path.join(deploy_dir, "Dockerfile*"))):
        if path.endswith(".dockerignore"):
            continue
        entry, stage = [], "?"
        for line in open(path, encoding="utf-8"):
            m = re.match(r"FROM\s+\S+(?:\s+AS\s+(\S+))?", line, re.I)
            if m:
                entry, stage = [], m.group(1) or "?"
            m = re.match(r"(ENTRYPOINT|CMD)\s+(\[.*\])\s*$", line)
            if not m:
                continue
            words = json.loads(m.group(2))
            if m.group(1) == "ENTRYPOINT":
                entry = words
                words = []
            checker.check_args(f"{os.path.basename(path)} stage {stage} {m.group(1)}", entry,
                               words)


def render(kubectl, directory):
    out = subprocess.run([kubectl, "kustomize", directory], capture_output=True, text=True,
                         timeout=120)
    if out.returncode != 0:
        sys.exit(f"check_manifests: kubectl kustomize {directory} failed:\n{out.stderr}")
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin_dir", required=True)
    ap.add_argument("--k8s_dir", default=os.path.join(here, "k8s"))
    ap.add_argument("--file", action="append", default=[], help="extra raw YAML to check")
    ap.add_argument("--no_kustomize", action="store_true", help="check raw files only")
    args = ap.parse_args()
    checker = Checker(args.bin_dir)

    # Every YAML file parses, and containers with a command in raw files are checked (patches
    # without a command are covered by the renderings).
    raw_files = sorted(glob.glob(os.path.join(args.k8s_dir, "**", "*.yaml"), recursive=True))
    for path in raw_files + args.file:
        with open(path, encoding="utf-8") as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        check_documents(checker, docs, os.path.relpath(path), strict_env=False)

    kubectl = None if args.no_kustomize else shutil.which("kubectl")
    rendered = []
    if kubectl:
        for kfile in sorted(glob.glob(os.path.join(args.k8s_dir, "**", "kustomization.yaml"),
                                      recursive=True)):
            directory = os.path.dirname(kfile)
            check_documents(checker, render(kubectl, directory), os.path.relpath(directory),
                            strict_env=True)
            rendered.append(os.path.relpath(directory))
    else:
        print("check_manifests: kubectl not found; checked raw files only (no env or drain "
              "checks)")
    if not args.file:
        check_dockerfiles(checker, here)

    print(f"check_manifests: {len(raw_files) + len(args.file)} YAML files, rendered "
          f"{', '.join(rendered) or 'nothing'}; {checker.checked_flags} flag uses against "
          f"{', '.join(b + (' ' + s if s else '') for b, s in sorted(checker.known, key=str))}")
    for p in checker.problems:
        print("PROBLEM:", p)
    return 1 if checker.problems else 0


if __name__ == "__main__":
    sys.exit(main())

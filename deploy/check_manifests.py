#!/usr/bin/env python3
"""Checks deploy/ against the real binaries, so a manifest cannot name a flag that does not exist.

For every container that runs a Cascade binary (in the kustomize renderings of base and each
overlay, in raw YAML files given with --file, and in the Dockerfiles' ENTRYPOINT/CMD):
  * each --flag it passes is one that `<binary> --help` lists (`cascade mkmodel --help` for the
    mkmodel init container);
  * each $(VAR) in its args is defined by its env or by a ConfigMap it loads with envFrom
    (Kubernetes would otherwise pass the text "$(VAR)" on unchanged);
  * its gRPC probes use its --port (and none probes an internal-auth port: the kubelet cannot
    present a certificate), HTTP probes its --metrics_port, its Prometheus annotation names its
    --metrics_port;
  * terminationGracePeriodSeconds covers the preStop sleep plus --drain_timeout.
In the renderings and --file inputs, secure defaults (issue 15):
  * every object validates against the Kubernetes schemas (deploy/validate_schemas.mjs, npm
    kubernetes-models in scripts/node);
  * every container and init container has resource requests and limits (cpu and memory
    requested, memory limited) and runs non-root, without privilege escalation, with a
    read-only root filesystem and all capabilities dropped; pods mount no service-account token
    unless their service account is one a Job needs (cascade-certs);
  * registry, workers and gateways run with --internal_ca/--internal_cert/--internal_key from a
    mounted Secret made by the certs Job, never --insecure_internal; the gateway reads
    --auth_token_file from a Secret;
  * each rendering of the stack has NetworkPolicies selecting the registry and the workers, and a
    PodDisruptionBudget for every Deployment and StatefulSet.
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
import tempfile

try:
    import yaml
except ImportError:
    print("check_manifests: PyYAML is not installed (apt-get install python3-yaml); skipping")
    sys.exit(77)

BINARIES = ("cascade-registry", "cascade-worker", "cascade-gateway", "cascade")
INTERNAL = ("cascade-registry", "cascade-worker", "cascade-gateway")
# Service accounts whose pods may mount a token (they call the API server).
TOKEN_ACCOUNTS = ("cascade-certs",)
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
                metrics = resolve(given.get("metrics_port", ""))
                named = {str(p.get("name")): str(p.get("containerPort"))
                         for p in c.get("ports") or []}
                for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                    grpc = (c.get(probe) or {}).get("grpc")
                    if grpc and str(grpc.get("port")) != port:
                        checker.problem(where, f"{probe} dials gRPC port {grpc.get('port')}, "
                                        f"but --port={port or '(unset)'}")
                    if (grpc and "internal_cert" in given and str(grpc.get("port")) == port and
                            os.path.basename((c.get("command") or [""])[0]) != "cascade-gateway"):
                        checker.problem(where, f"{probe} is a gRPC probe of an internal-auth "
                                        "port: the kubelet cannot present a certificate (probe "
                                        "/healthz on the metrics port)")  # the gateway's is public
                    http = (c.get(probe) or {}).get("httpGet")
                    if http:
                        hp = str(http.get("port"))
                        if named.get(hp, hp) != metrics:
                            checker.problem(where, f"{probe} GETs port {hp}, but "
                                            f"--metrics_port={metrics or '(unset)'}")
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


def mounted_secret(pod, container, path):
    """The secretName of the Secret volume `container` mounts above `path`, or None."""
    volumes = {v.get("name"): v for v in pod.get("volumes") or []}
    for m in container.get("volumeMounts") or []:
        mount = m.get("mountPath", "").rstrip("/") + "/"
        if path.startswith(mount):
            secret = (volumes.get(m.get("name")) or {}).get("secret")
            return secret.get("secretName") if secret else None
    return None


def selects(selector, labels):
    match = (selector or {}).get("matchLabels") or {}
    return bool(match) and all(labels.get(k) == v for k, v in match.items())


def check_security(checker, docs, source):
    """The secure defaults listed in the module docstring, on fully rendered objects."""
    job_text = "\n".join(json.dumps(d) for d in docs
                         if isinstance(d, dict) and d.get("kind") == "Job")
    workloads = []
    for doc in docs:
        if not isinstance(doc, dict):
            continue
        name = f"{source}: {doc.get('kind', '?')}/{doc.get('metadata', {}).get('name', '?')}"
        for pod in walk_pod_specs(doc):
            sa = pod.get("serviceAccountName", "default")
            if pod.get("automountServiceAccountToken") is not False and sa not in TOKEN_ACCOUNTS:
                checker.problem(name, "automountServiceAccountToken is not false (the pod does "
                                "not call the API server)")
            pod_sec = pod.get("securityContext") or {}
            for c in (pod.get("initContainers") or []) + (pod.get("containers") or []):
                where = f"{name} container {c.get('name', '?')}"
                sec = c.get("securityContext") or {}
                res = c.get("resources") or {}
                req, lim = res.get("requests") or {}, res.get("limits") or {}
                if "cpu" not in req or "memory" not in req or "memory" not in lim:
                    checker.problem(where, "needs resources.requests cpu and memory and "
                                    "resources.limits memory")
                if not (sec.get("runAsNonRoot", pod_sec.get("runAsNonRoot")) is True):
                    checker.problem(where, "may run as root (runAsNonRoot is not true)")
                if sec.get("allowPrivilegeEscalation") is not False:
                    checker.problem(where, "allowPrivilegeEscalation is not false")
                if sec.get("readOnlyRootFilesystem") is not True:
                    checker.problem(where, "readOnlyRootFilesystem is not true")
                if "ALL" not in ((sec.get("capabilities") or {}).get("drop") or []):
                    checker.problem(where, "capabilities.drop does not include ALL")
                argv = list(c.get("command") or []) + list(c.get("args") or [])
                binary = os.path.basename(argv[0]) if argv else ""
                if binary not in INTERNAL:
                    continue
                given = {}
                for a in argv[1:]:
                    if a.startswith("--"):
                        k, _, v = a[2:].partition("=")
                        given[k] = v
                if "insecure_internal" in given:
                    checker.problem(where, "--insecure_internal: internal RPCs without "
                                    "authentication (the manifests must stay secure)")
                flags = ["internal_ca", "internal_cert", "internal_key"]
                if binary == "cascade-gateway":
                    flags.append("auth_token_file")
                for flag in flags:
                    if flag not in given:
                        checker.problem(where, f"--{flag} is missing (internal auth is on by "
                                        "default in the manifests)")
                        continue
                    secret = mounted_secret(pod, c, given[flag])
                    if secret is None:
                        checker.problem(where, f"--{flag}={given[flag]} is not on a mounted "
                                        "Secret volume")
                    elif f'"{secret}"' not in job_text and secret not in job_text:
                        checker.problem(where, f"Secret {secret} (for --{flag}) is made by no "
                                        "Job in this rendering")
        if doc.get("kind") in ("Deployment", "StatefulSet"):
            labels = (((doc.get("spec") or {}).get("template") or {}).get("metadata")
                      or {}).get("labels") or {}
            workloads.append((name, labels))
    policies = [d for d in docs if isinstance(d, dict) and d.get("kind") == "NetworkPolicy"]
    pdbs = [d for d in docs if isinstance(d, dict) and d.get("kind") == "PodDisruptionBudget"]
    for name, labels in workloads:
        if not any(selects((p.get("spec") or {}).get("selector"), labels) for p in pdbs):
            checker.problem(name, "no PodDisruptionBudget selects its pods")
        component = labels.get("app.kubernetes.io/name")
        if component in ("cascade-registry", "cascade-worker"):
            guarded = [p for p in policies
                       if selects((p.get("spec") or {}).get("podSelector"), labels)
                       and "Ingress" in ((p.get("spec") or {}).get("policyTypes") or [])]
            if not guarded:
                checker.problem(name, "no NetworkPolicy limits who may connect to it")


def validate_schemas(checker, rendered, node_dir):
    """Runs deploy/validate_schemas.mjs over {source: [objects]}; its problems become ours."""
    node = shutil.which("node")
    here = os.path.dirname(os.path.abspath(__file__))
    if node is None:
        checker.problem("schemas", "node is not installed; run scripts/setup.sh")
        return 0
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(rendered, f)
        path = f.name
    try:
        out = subprocess.run([node, os.path.join(here, "validate_schemas.mjs"), path, node_dir],
                             capture_output=True, text=True, timeout=120)
    finally:
        os.unlink(path)
    for line in out.stdout.splitlines():
        if line.startswith("PROBLEM: "):
            checker.problem("schemas", line[len("PROBLEM: "):])
    if out.returncode not in (0, 1) or (out.returncode == 1 and "PROBLEM" not in out.stdout):
        checker.problem("schemas", f"validate_schemas.mjs exited {out.returncode}: "
                        f"{out.stderr.strip() or out.stdout.strip()}")
    m = re.search(r"(\d+) objects valid", out.stdout)
    return int(m.group(1)) if m else 0


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
    ap.add_argument("--expect_problem", action="append", default=[], metavar="REGEX",
                    help="for tests of this checker: exit 0 only if every REGEX matches a "
                    "reported problem")
    ap.add_argument("--node_dir", default=os.path.join(here, "..", "scripts", "node"),
                    help="where node_modules with kubernetes-models is")
    args = ap.parse_args()
    checker = Checker(args.bin_dir)
    strict = {}  # source -> objects: the renderings and --file inputs, checked in full

    # Every YAML file parses, and containers with a command in raw files are checked (patches
    # without a command are covered by the renderings).
    raw_files = sorted(glob.glob(os.path.join(args.k8s_dir, "**", "*.yaml"), recursive=True))
    for path in raw_files + args.file:
        with open(path, encoding="utf-8") as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        check_documents(checker, docs, os.path.relpath(path), strict_env=False)
        if path in args.file:
            strict[os.path.relpath(path)] = docs

    kubectl = None if args.no_kustomize else shutil.which("kubectl")
    rendered = []
    if kubectl:
        for kfile in sorted(glob.glob(os.path.join(args.k8s_dir, "**", "kustomization.yaml"),
                                      recursive=True)):
            directory = os.path.dirname(kfile)
            docs = render(kubectl, directory)
            check_documents(checker, docs, os.path.relpath(directory), strict_env=True)
            rendered.append(os.path.relpath(directory))
            strict[os.path.relpath(directory)] = docs
    elif not args.no_kustomize:
        checker.problem("kubectl", "kubectl is not installed: the overlays cannot be rendered "
                        "and validated; run scripts/setup.sh")
    for source, docs in strict.items():
        check_security(checker, docs, source)
    valid = validate_schemas(checker, strict, args.node_dir) if strict else 0
    if not args.file:
        check_dockerfiles(checker, here)

    print(f"check_manifests: {len(raw_files) + len(args.file)} YAML files, rendered "
          f"{', '.join(rendered) or 'nothing'}; {checker.checked_flags} flag uses against "
          f"{', '.join(b + (' ' + s if s else '') for b, s in sorted(checker.known, key=str))}; "
          f"{valid} objects valid against the Kubernetes schemas")
    for p in checker.problems:
        print("PROBLEM:", p)
    if args.expect_problem:
        missed = [r for r in args.expect_problem
                  if not any(re.search(r, p) for p in checker.problems)]
        for r in missed:
            print("NOT REPORTED:", r)
        if not missed:
            print(f"check_manifests: all {len(args.expect_problem)} expected problems reported")
        return 1 if missed else 0
    return 1 if checker.problems else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The invariants of a rendered Halyard kustomization, the ones a schema cannot see.

    deploy/k8s/invariants.py deploy/k8s/overlays/api-only   # renders it (kubectl kustomize)
    kubectl kustomize DIR | deploy/k8s/invariants.py -      # or checks what it is given

Run it before `kubectl apply -k` (deploy/k8s/validate runs it on every overlay in CI).
Each problem names the object and the field; exit status 1 when there is any:

- every pod (Deployment, Job, ...) has `automountServiceAccountToken: false`;
- every container's liveness probe is GET /healthz (the process is alive) and its
  readiness probe GET /readyz (the broker, models, consumers); a startup probe, if any,
  GET /healthz;
- a worker Deployment pinned to a GPU (`--gpu N`) asks for `nvidia.com/gpu` in its limits
  and sets NVIDIA_DRIVER_CAPABILITIES with `compute`; any other Deployment asks for no
  GPU;
- every ScaledObject scales an existing Deployment, and its nats-jetstream triggers name,
  on the stream HALYARD_JOBS, exactly the consumers (`pool-<token>`) of the pools that
  Deployment serves; every pool of the sweep has a worker Deployment and a ScaledObject
  trigger (a trigger on a consumer that no worker creates makes KEDA scale on nonsense);
- the pods' label halyard.dev/run is the sweep's name, and every Halyard pod mounts the
  same sweep;
- no Secret holds a placeholder (REPLACE-ME, an empty value, `...`), and the rendering
  contains no REPLACE-ME anywhere;
- every container that reaches NATS does so over TLS (`tls://` URLs) and checks the
  nodes against a CA mounted from a Secret, only its `ca.crt` key;
- (issue 46) GPU pods are placed by their nvidia.com/gpu request alone: no nodeSelector
  or node affinity on a label that only GPU Feature Discovery sets (nvidia.com/…);
- the coordinator Job ignores disruptions (podFailurePolicy `Ignore` on the pod condition
  DisruptionTarget: a drain or preemption does not spend backoffLimit) and a
  PodDisruptionBudget with maxUnavailable 0 (or minAvailable 1) covers its pod;
- a workload rendering (one with a Job or Deployment) holds no Namespace, Secret or
  PersistentVolumeClaim: `kubectl delete -k` of it must not delete them;
- a Deployment that a ScaledObject scales has no `spec.replicas` (it would reset KEDA's
  count on every apply); every ScaledObject has a `fallback`; and a rendering with both
  the coordinator Job and a ScaledObject is refused (the ScaledObjects are applied once
  the coordinator has created the consumers: KEDA up to 2.19 scales a pool whose
  consumer does not exist yet to its maximum);
- every image is pinned by digest, or pulled `Always` (a tag can be pushed again);
- a managed-server worker (image with vLLM or SGLang: `--gpu` with a comma set, or HOME
  set) has HOME and every cache variable (HF_HOME, TRITON_CACHE_DIR, VLLM_CACHE_ROOT,
  XDG_CACHE_HOME, …) under a mounted writable emptyDir or ephemeral volume;
- a NetworkPolicy that selects the NATS pods admits the monitoring port 8222 only from
  named namespaces or pods, never from everywhere.

Which pools a worker serves follows `halyard worker`: with `--sweep` and no `--gpu`,
the pools of the sweep's models not placed on a GPU; with `--gpu N`, those of the local
models placed on GPU N; with `--only-pool P` (repeatable; `halyard deploy k8s` writes
one per Deployment), only those among them. Pool names and consumer names follow halyard-coordinator's sweep
parser and halyard_proto::subjects (tests/tests/deploy_manifests.rs checks the manifests
with that code itself; this file repeats its rules, BLAKE3 included, to check renders).
"""

import base64
import os
import re
import shlex
import struct
import subprocess
import sys
import tomllib

import yaml

JOBS_STREAM = "HALYARD_JOBS"
# The cache variables of a managed server (vLLM, SGLang and the libraries under them).
SERVER_CACHE_VARS = ["HOME", "XDG_CACHE_HOME", "HF_HOME", "TRITON_CACHE_DIR", "VLLM_CACHE_ROOT",
                     "TORCHINDUCTOR_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE", "OUTLINES_CACHE_DIR"]
PLACEHOLDERS = {"", "REPLACE-ME", "...", "changeme", "CHANGEME", "sk-..."}
POD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}


# --- BLAKE3 (one chunk: inputs up to 1024 bytes, as pool names are) ---------------------

_IV = (0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A, 0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19)
_PERM = (2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8)
_CHUNK_START, _CHUNK_END, _ROOT = 1, 2, 8
_M32 = 0xFFFFFFFF


def _rotr(x, n):
    return ((x >> n) | (x << (32 - n))) & _M32


def _g(s, a, b, c, d, x, y):
    s[a] = (s[a] + s[b] + x) & _M32
    s[d] = _rotr(s[d] ^ s[a], 16)
    s[c] = (s[c] + s[d]) & _M32
    s[b] = _rotr(s[b] ^ s[c], 12)
    s[a] = (s[a] + s[b] + y) & _M32
    s[d] = _rotr(s[d] ^ s[a], 8)
    s[c] = (s[c] + s[d]) & _M32
    s[b] = _rotr(s[b] ^ s[c], 7)


def _compress(cv, block, block_len, flags):
    m = list(struct.unpack("<16I", block))
    s = list(cv) + list(_IV[:4]) + [0, 0, block_len, flags]
    for r in range(7):
        _g(s, 0, 4, 8, 12, m[0], m[1])
        _g(s, 1, 5, 9, 13, m[2], m[3])
        _g(s, 2, 6, 10, 14, m[4], m[5])
        _g(s, 3, 7, 11, 15, m[6], m[7])
        _g(s, 0, 5, 10, 15, m[8], m[9])
        _g(s, 1, 6, 11, 12, m[10], m[11])
        _g(s, 2, 7, 8, 13, m[12], m[13])
        _g(s, 3, 4, 9, 14, m[14], m[15])
        if r < 6:
            m = [m[i] for i in _PERM]
    return [s[i] ^ s[i + 8] for i in range(8)]


def blake3(data):
    """BLAKE3 of `data` (at most one 1024-byte chunk), 32 bytes."""
    if len(data) > 1024:
        raise ValueError("blake3 here hashes one chunk (1024 bytes) at most")
    blocks = [data[i:i + 64] for i in range(0, len(data), 64)] or [b""]
    cv = _IV
    for i, b in enumerate(blocks):
        flags = (_CHUNK_START if i == 0 else 0)
        if i == len(blocks) - 1:
            flags |= _CHUNK_END | _ROOT
        cv = _compress(cv, b.ljust(64, b"\0"), len(b), flags)
    return struct.pack("<8I", *cv)


def pool_token(pool):
    """halyard_proto::subjects::pool_token."""
    clean = "".join(c if (c.isascii() and c.isalnum()) or c in "-_" else "_" for c in pool)
    if clean == pool and pool:
        return clean
    return f"{clean}-{blake3(pool.encode()).hex()[:8]}"


def pool_consumer(pool):
    """halyard_proto::subjects::pool_consumer."""
    return f"pool-{pool_token(pool)}"


# --- the sweep -----------------------------------------------------------------------

def sweep_pools(sweep):
    """{pool: placement} of a parsed sweep (halyard-coordinator's sweep::models::pool): the
    GPU index of a gguf model placed on one, ("server", N) for a managed server on N GPUs
    per server, None for what workers without --gpu serve."""
    pools = {}
    for m in sweep.get("model", []):
        backend = m.get("backend")
        if backend == "server":
            gpus = m.get("gpus", 1)
            pools[m.get("pool") or f"server/{m['name']}"] = ("server", gpus) if gpus else None
            continue
        local = backend == "gguf"
        gpu = m.get("gpu") if local else None
        placement = f"gpu{gpu}" if gpu is not None else "cpu"
        if m.get("pool") is not None:
            pool = f"{m['pool']}@{placement}" if local else m["pool"]
        elif local:
            pool = f"gguf/{m['name']}@{placement}"
        elif backend == "embed":
            pool = f"embed/{m['name']}"
        else:
            pool = m["name"]
        pools[pool] = gpu
    return pools


# --- the checks ----------------------------------------------------------------------

def ident(doc):
    md = doc.get("metadata", {})
    return f"{doc.get('kind')} {md.get('namespace', '-')}/{md.get('name')}"


def pod_spec(doc):
    spec = doc.get("spec", {})
    if doc.get("kind") == "CronJob":
        spec = spec.get("jobTemplate", {}).get("spec", {})
    if doc.get("kind") == "Pod":
        return spec, "spec"
    return spec.get("template", {}).get("spec"), "spec.template.spec"


def pod_labels(doc):
    return doc.get("spec", {}).get("template", {}).get("metadata", {}).get("labels", {}) or {}


def container_args(c):
    return [str(a) for a in (c.get("command") or []) + (c.get("args") or [])]


def flag(args, name):
    """The value of `--name V` or `--name=V`, None when absent."""
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def gpu_sets(args):
    """The GPU sets of every `--gpu N[,M...]` (repeatable)."""
    sets = []
    for i, a in enumerate(args):
        v = args[i + 1] if a == "--gpu" and i + 1 < len(args) else (a.split("=", 1)[1] if a.startswith("--gpu=") else None)
        if v is not None:
            sets.append([int(x) for x in v.split(",")])
    return sets


def repeated(args, name):
    """Every value of a repeatable `--name V` / `--name=V`."""
    out = []
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            out.append(args[i + 1])
        elif a.startswith(name + "="):
            out.append(a.split("=", 1)[1])
    return out


def served_by(pools, sets, only=()):
    """The pools a worker with GPU sets `sets` (none: an API worker) serves, among
    `only` (its `--only-pool` values) when it names any."""
    if only:
        pools = {p: g for p, g in pools.items() if p in only}
    if not sets:
        return {p for p, g in pools.items() if g is None}
    gpus = {g for s in sets for g in s}
    sizes = {len(s) for s in sets}
    return {p for p, g in pools.items()
            if (isinstance(g, int) and g in gpus) or (isinstance(g, tuple) and g[1] in sizes)}


def secret_values(doc):
    for k, v in (doc.get("stringData") or {}).items():
        yield k, "stringData", str(v)
    for k, v in (doc.get("data") or {}).items():
        try:
            yield k, "data", base64.b64decode(v).decode("utf-8", "replace")
        except ValueError:
            yield k, "data", str(v)


def check(docs, text="", scaling=()):
    """Problems (strings naming object and field) of one rendered set of objects; `scaling`:
    the ScaledObjects of the overlay's scaling/ kustomization, applied after it and checked
    with it (triggers against the pools its Deployments serve)."""
    problems = []
    own_scaled = [d for d in docs if d.get("kind") == "ScaledObject"]
    docs = list(docs) + list(scaling)

    def bad(doc, field, what):
        problems.append(f"{ident(doc)}: {field}: {what}")

    by_kind = {}
    for d in docs:
        by_kind.setdefault(d.get("kind"), []).append(d)
    configmaps = {(d["metadata"].get("namespace"), d["metadata"]["name"]): d for d in by_kind.get("ConfigMap", [])}

    if "REPLACE-ME" in text:
        line = next(i for i, l in enumerate(text.splitlines(), 1) if "REPLACE-ME" in l)
        problems.append(f"rendering: line {line}: contains REPLACE-ME (a placeholder from a *.example file)")
    for d in by_kind.get("Secret", []):
        for k, where, v in secret_values(d):
            if v.strip() in PLACEHOLDERS or "REPLACE-ME" in v:
                bad(d, f"{where}.{k}", f"placeholder value {v.strip()!r}: create the real secret file")

    sweeps = {}   # (namespace, configmap) -> parsed sweep
    served = {}   # deployment name -> (namespace, set of pools)
    workloads = [d for k in POD_KINDS | {"CronJob", "Pod"} for d in by_kind.get(k, [])]
    for d in workloads:
        spec, at = pod_spec(d)
        if spec is None:
            bad(d, at, "no pod spec")
            continue
        if spec.get("automountServiceAccountToken") is not False:
            bad(d, f"{at}.automountServiceAccountToken",
                f"{spec.get('automountServiceAccountToken')!r}, must be false (Halyard calls no Kubernetes API)")
        ns = d["metadata"].get("namespace")
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for c in spec.get("containers", []):
            cat = f"{at}.containers[{c.get('name')}]"
            for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz"), ("startupProbe", "/healthz")):
                p = c.get(probe)
                if p is None:
                    if probe != "startupProbe":
                        bad(d, f"{cat}.{probe}", f"missing (must GET {path})")
                    continue
                got = (p.get("httpGet") or {}).get("path")
                if got != path:
                    why = ("liveness is the process alone: the broker belongs to readiness"
                           if probe != "readinessProbe" else "readiness carries the broker, models and consumers")
                    bad(d, f"{cat}.{probe}.httpGet.path", f"{got!r}, must be {path} ({why})")
            nats_env = {e["name"]: e.get("value") for e in c.get("env", [])}
            url = nats_env.get("HALYARD_NATS_URL")
            if url is not None:
                plain = [u for u in url.split(",") if not u.strip().startswith("tls://")]
                if plain:
                    bad(d, f"{cat}.env[HALYARD_NATS_URL]",
                        f"{', '.join(plain)}: not tls:// (passwords, jobs and results would cross the network unencrypted; TLS is the default)")
                ca = nats_env.get("HALYARD_NATS_CA") or ""
                ca_mount = next((m for m in c.get("volumeMounts", [])
                                 if ca.startswith(m["mountPath"].rstrip("/") + "/")), None) if ca else None
                secret = (volumes.get(ca_mount["name"]) or {}).get("secret") if ca_mount else None
                if not secret:
                    bad(d, f"{cat}.env[HALYARD_NATS_CA]", f"{ca!r} is not mounted from a Secret (the NATS nodes' CA)")
                elif [i.get("key") for i in secret.get("items") or [{}]] != ["ca.crt"]:
                    bad(d, f"{cat}.volumes[{ca_mount['name']}]",
                        "must mount only the key ca.crt of the Secret (no private key in a Halyard pod)")
            args = container_args(c)
            gpu = flag(args, "--gpu")
            res = c.get("resources") or {}
            limits, requests = res.get("limits") or {}, res.get("requests") or {}
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            sets = gpu_sets(args)
            if d.get("kind") == "Deployment" and gpu is not None:
                need = len({g for s in sets for g in s})
                if int(str(limits.get("nvidia.com/gpu", 0))) < need:
                    bad(d, f"{cat}.resources.limits[nvidia.com/gpu]",
                        f"{limits.get('nvidia.com/gpu')!r}: a worker with --gpu {' --gpu '.join(map(str, [','.join(map(str, s)) for s in sets]))} must ask for {need} GPU(s)")
                if "nvidia.com/gpu" in requests and str(requests["nvidia.com/gpu"]) != str(limits.get("nvidia.com/gpu")):
                    bad(d, f"{cat}.resources.requests[nvidia.com/gpu]", "must equal the limit")
                caps = (env.get("NVIDIA_DRIVER_CAPABILITIES") or "").split(",")
                if "compute" not in caps and "all" not in caps:
                    bad(d, f"{cat}.env[NVIDIA_DRIVER_CAPABILITIES]",
                        f"{env.get('NVIDIA_DRIVER_CAPABILITIES')!r}: must include compute (CUDA)")
            elif "nvidia.com/gpu" in limits or "nvidia.com/gpu" in requests:
                bad(d, f"{cat}.resources[nvidia.com/gpu]", "an API worker (no --gpu) must not ask for a GPU")
            # The sweep this container reads.
            sweep_path = flag(args, "--sweep")
            if not sweep_path and "coordinator" in args:
                i = args.index("coordinator")
                sweep_path = args[i + 1] if i + 1 < len(args) else None
            if not sweep_path:
                continue
            mount = next((m for m in c.get("volumeMounts", [])
                          if sweep_path == m["mountPath"] or sweep_path.startswith(m["mountPath"].rstrip("/") + "/")), None)
            vol = volumes.get(mount["name"]) if mount else None
            cm = (vol or {}).get("configMap", {}).get("name")
            if not cm:
                bad(d, f"{cat}.volumeMounts", f"{sweep_path} is not mounted from a ConfigMap")
                continue
            key = mount.get("subPath") or os.path.relpath(sweep_path, mount["mountPath"])
            doc = configmaps.get((ns, cm))
            if doc is None or key not in (doc.get("data") or {}):
                bad(d, f"{at}.volumes[{mount['name']}].configMap.name", f"ConfigMap {cm} with key {key} is not in the rendering")
                continue
            try:
                sweep = tomllib.loads(doc["data"][key])
            except tomllib.TOMLDecodeError as e:
                bad(doc, f"data.{key}", f"not TOML: {e}")
                continue
            sweeps[(ns, cm)] = sweep
            run = pod_labels(d).get("halyard.dev/run")
            if run != sweep.get("name"):
                bad(d, "spec.template.metadata.labels[halyard.dev/run]",
                    f"{run!r}, must be the sweep's name {sweep.get('name')!r} (ConfigMap {cm})")
            if d.get("kind") == "Deployment" and "worker" in args:
                pools = sweep_pools(sweep)
                only = repeated(args, "--only-pool")
                for p in only:
                    if p not in pools:
                        bad(d, f"{cat}.args", f"--only-pool {p!r}: no pool of ConfigMap {cm}'s sweep")
                served[d["metadata"]["name"]] = (ns, cm, served_by(pools, sets, only))
                if not served[d["metadata"]["name"]][2]:
                    bad(d, f"{cat}.args", f"serves no pool of ConfigMap {cm}'s sweep (--gpu {gpu})")
    if len(sweeps) > 1:
        problems.append(f"rendering: pods mount different sweeps {sorted(cm for _, cm in sweeps)}: one sweep per run")

    deployments = {(d["metadata"].get("namespace"), d["metadata"]["name"]) for d in by_kind.get("Deployment", [])}
    triggered = {}
    for so in by_kind.get("ScaledObject", []):
        ns = so["metadata"].get("namespace")
        ref = so.get("spec", {}).get("scaleTargetRef", {})
        if ref.get("kind", "Deployment") != "Deployment" or (ns, ref.get("name")) not in deployments:
            bad(so, "spec.scaleTargetRef", f"{ref.get('kind', 'Deployment')} {ref.get('name')!r} is not in the rendering")
            continue
        target = ref["name"]
        if target not in served:
            bad(so, "spec.scaleTargetRef.name", f"Deployment {target} is not a `halyard worker --sweep` Deployment")
            continue
        consumers = {}
        for i, t in enumerate(so["spec"].get("triggers", [])):
            md = t.get("metadata", {})
            if t.get("type") != "nats-jetstream":
                bad(so, f"spec.triggers[{i}].type", f"{t.get('type')!r}, expected nats-jetstream")
                continue
            if md.get("stream") != JOBS_STREAM:
                bad(so, f"spec.triggers[{i}].metadata.stream", f"{md.get('stream')!r}, must be {JOBS_STREAM}")
            if not re.fullmatch(r"[0-9]+", str(md.get("lagThreshold", ""))):
                bad(so, f"spec.triggers[{i}].metadata.lagThreshold", f"{md.get('lagThreshold')!r}: a number of messages")
            consumers[md.get("consumer")] = i
        _, cm, pools = served[target]
        want = {pool_consumer(p): p for p in pools}
        for c, i in consumers.items():
            if c not in want:
                bad(so, f"spec.triggers[{i}].metadata.consumer",
                    f"{c!r} is no consumer of the pools Deployment {target} serves "
                    f"({', '.join(f'{p} -> {pc}' for pc, p in sorted(want.items()))})")
        for c, p in sorted(want.items()):
            if c not in consumers:
                bad(so, "spec.triggers", f"no trigger on {c!r}, the consumer of pool {p!r} that Deployment {target} serves")
        triggered.setdefault(target, []).append(so)
    for target, (ns, cm, pools) in sorted(served.items()):
        if len(triggered.get(target, [])) != 1:
            problems.append(f"Deployment {ns}/{target}: {len(triggered.get(target, []))} ScaledObjects scale it, expected 1")
    problems.extend(check_issue46(docs, by_kind, own_scaled))
    for (ns, cm), sweep in sweeps.items():
        every = set(sweep_pools(sweep))
        covered = set().union(*(p for n, c, p in served.values() if c == cm)) if served else set()
        for p in sorted(every - covered):
            problems.append(f"ConfigMap {ns}/{cm}: pool {p!r} of the sweep has no worker Deployment serving it")
    return problems


def check_issue46(docs, by_kind, own_scaled):
    """Items 6-10 of issue 46 and the managed server's caches (see the module docs)."""
    problems = []

    def bad(doc, field, what):
        problems.append(f"{ident(doc)}: {field}: {what}")

    workloads = [d for k in POD_KINDS | {"CronJob", "Pod"} for d in by_kind.get(k, [])]
    for d in workloads:
        spec, at = pod_spec(d)
        if spec is None:
            continue
        gpu = any("nvidia.com/gpu" in ((c.get("resources") or {}).get("limits") or {})
                  for c in spec.get("containers", []))
        # 6: labels of GPU Feature Discovery.
        for k in (spec.get("nodeSelector") or {}):
            if k.startswith("nvidia.com/"):
                bad(d, f"{at}.nodeSelector[{k}]",
                    "a label only GPU Feature Discovery / the GPU Operator sets: with the device plugin "
                    "alone no node has it and the pod stays Pending (the nvidia.com/gpu request places it)")
        na = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
              .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
        for term in na.get("nodeSelectorTerms", []):
            for e in term.get("matchExpressions", []):
                if str(e.get("key", "")).startswith("nvidia.com/"):
                    bad(d, f"{at}.affinity.nodeAffinity[{e['key']}]", "a label only GPU Feature Discovery sets")
        # 10: images.
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            image = str(c.get("image", ""))
            if "@sha256:" not in image and c.get("imagePullPolicy") != "Always":
                bad(d, f"{at}.containers[{c.get('name')}].imagePullPolicy",
                    f"{c.get('imagePullPolicy')!r} for {image!r}, a tag: a tag can be pushed again, so "
                    "pull Always or name the image by digest")
        # Managed servers: HOME and caches on a writable volume.
        for c in spec.get("containers", []):
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            sets = gpu_sets(container_args(c))
            if not (gpu and (any(len(x) > 1 for x in sets) or "HOME" in env)):
                continue
            vols = {v["name"]: v for v in spec.get("volumes", [])}
            for var in SERVER_CACHE_VARS:
                path = env.get(var)
                mount = next((m for m in c.get("volumeMounts", []) if path and (
                    path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/"))), None)
                vol = vols.get(mount["name"]) if mount else None
                if not path:
                    bad(d, f"{at}.containers[{c.get('name')}].env[{var}]",
                        "unset: the server's caches would land on the read-only root (or a HOME with no passwd entry)")
                elif not mount or mount.get("readOnly") or not vol or not ("emptyDir" in vol or "ephemeral" in vol):
                    bad(d, f"{at}.containers[{c.get('name')}].env[{var}]",
                        f"{path!r} is not on a mounted writable emptyDir or ephemeral volume")
    # 7: the coordinator Job.
    pdbs = by_kind.get("PodDisruptionBudget", [])
    for j in by_kind.get("Job", []):
        rules = ((j.get("spec") or {}).get("podFailurePolicy") or {}).get("rules", [])
        if not any(r.get("action") == "Ignore" and any(c.get("type") == "DisruptionTarget"
                                                       for c in r.get("onPodConditions", [])) for r in rules):
            bad(j, "spec.podFailurePolicy.rules",
                "no `Ignore` on the pod condition DisruptionTarget: a drain or preemption counts against backoffLimit")
        labels = pod_labels(j)
        covered = [p for p in pdbs
                   if p["spec"].get("selector", {}).get("matchLabels")
                   and all(labels.get(k) == v for k, v in p["spec"]["selector"]["matchLabels"].items())
                   and (str(p["spec"].get("maxUnavailable")) == "0" or str(p["spec"].get("minAvailable")) in ("1", "100%"))]
        if not covered:
            bad(j, "PodDisruptionBudget", "none with maxUnavailable 0 covers the coordinator's pod: a drain evicts it mid-run")
    # 8: what `kubectl delete -k` of a workload rendering would delete.
    if by_kind.get("Job") or by_kind.get("Deployment"):
        for kind in ("Namespace", "Secret", "PersistentVolumeClaim"):
            for d in by_kind.get(kind, []):
                bad(d, "kind", f"a {kind} in a workload rendering: `kubectl delete -k` of it would delete it "
                               "(the namespace takes NATS and every volume with it)")
    # 9: KEDA.
    scaled = {(s["metadata"].get("namespace"), s["spec"].get("scaleTargetRef", {}).get("name")): s
              for s in by_kind.get("ScaledObject", [])}
    for d in by_kind.get("Deployment", []):
        if (d["metadata"].get("namespace"), d["metadata"]["name"]) in scaled and "replicas" in d.get("spec", {}):
            bad(d, "spec.replicas", "set on a Deployment KEDA scales: every apply resets KEDA's count")
    for so in by_kind.get("ScaledObject", []):
        fb = so.get("spec", {}).get("fallback") or {}
        if not (isinstance(fb.get("failureThreshold"), int) and isinstance(fb.get("replicas"), int)):
            bad(so, "spec.fallback", "missing: when the NATS monitoring endpoint fails, KEDA keeps no replica count")
        if by_kind.get("Job") and any(so is o for o in own_scaled):
            bad(so, "kind", "rendered with the coordinator Job: ScaledObjects go in a kustomization applied "
                            "once the coordinator has created the consumers (KEDA <= 2.19 scales a pool whose "
                            "consumer is missing to its maximum)")
    # 10: the monitoring port.
    for np_ in by_kind.get("NetworkPolicy", []):
        sel = (np_["spec"].get("podSelector") or {}).get("matchLabels") or {}
        if sel.get("app.kubernetes.io/name") != "nats":
            continue
        for i, rule in enumerate(np_["spec"].get("ingress", [])):
            ports = {str(p.get("port")) for p in rule.get("ports", [])}
            if ports and "8222" not in ports:
                continue
            froms = rule.get("from") or []
            if not froms or any(not f.get("namespaceSelector") and not (f.get("podSelector") or {}).get("matchLabels")
                                for f in froms):
                bad(np_, f"spec.ingress[{i}]", "admits port 8222 (/jsz, /connz) from every pod: name the namespaces or pods")
    return problems


def load(text):
    return [d for d in yaml.safe_load_all(text) if d]


def render(directory):
    run = subprocess.run(["kubectl", "kustomize", directory], capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {shlex.quote(directory)}: {run.stderr.strip()}")
    return run.stdout


def main(argv):
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    try:
        text = sys.stdin.read() if argv[0] == "-" else render(argv[0])
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    docs = load(text)
    problems = check(docs, text)
    for p in problems:
        print(f"error: {argv[0]}: {p}", file=sys.stderr)
    print(f"{argv[0]}: {len(docs)} objects, {len(problems)} invariant problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

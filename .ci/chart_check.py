#!/usr/bin/env python3
"""CI checks of the amd-gpu Helm chart (helm/amd-gpu), run by .ci/chart-check.

Offline: Helm's own Go library (helm-python-sdk, module helm_python, which
bundles libhelm_c.so) lints and renders the chart, and kubernetes-validate
checks every rendered object against the bundled OpenAPI schemas of concrete
Kubernetes versions. No helm binary and no cluster.

For the default values, for each ci/*-values.yaml (every optional feature
on; HAMi's Go chart's default values and its documented uses, rendered
unchanged: .ci/go_values_check.py says what more is checked of those), for
the seed chart's spellings and for listed admission writers (POLICY_WRITERS),
it checks:
  1. the values against values.schema.json, and `helm lint --strict`;
  2. every object, rendered for a cluster of each version in KUBE_VERSIONS,
     against that version's schemas (strict: unknown fields fail);
  3. the expected set of objects, the plugin's environment (each value maps
     to its variable), the RBAC rules (exactly what the code needs), the
     admission policies (nodes/status kept to the node's amd.com/gpumem and
     amd.com/gpucores with dp.reportNodeCapacity; the protected pod
     annotations: pods, pods/status and
     Bindings matched, the AMD keys everywhere and the shared ones on pods
     asking for amd.com/, the writers of the values and HAMi's by name), the pod
     hardening beyond PSS (read-only root, token mounted, no user namespace,
     HAMi's webhook label, the probes on a port of their own, apart from the
     metrics port, and admitted by the NetworkPolicy to no pod);
  4. the DaemonSet's pod template against Pod Security "restricted" (and so
     "baseline"), implemented below from the PSS spec: the only violations
     allowed are the hostPath volumes named in helm/amd-gpu/pss-exceptions.txt
     and root in its initContainer: entries (hookInstaller), and every name
     there must still be a hostPath volume or init container (no stale entry);
  5. the installers: dp.hookInstaller (on by default) renders the
     hook-installer init container, which copies the hook from dp.image into
     <dp.hostHookPath>/vgpu, where AMDGPU_DP_HOOK_PATH points, as root
     without capabilities, and the node installer's DaemonSet has exactly the
     privileges values.yaml names (privileged, hostPID, the host's /, root),
     a preStop that removes amd-gpud, and a selector disjoint from the plugin's;
     the default image is this project's, tagged with appVersion.
  6. the monitoring objects (.ci/monitor_check.py says what is checked):
     the metrics on HAMi's monitor port 9394, the monitor Service and
     ServiceMonitor, the scrape annotations, the scrapers the NetworkPolicy
     admits;
  7. the dashboard (.ci/dashboard_check.py says what is checked): off by
     default renders no ConfigMap; on, one ConfigMap in dashboard.namespace
     with the grafana_dashboard label and the dashboard file as its data.
Self-tests prove the checks bite: values the schema must reject; the policy
refusing to render for Kubernetes < 1.30; podLabels that would override the
chart's labels; the probe port equal to the metrics port; a render of the chart with its schema removed and runAsUser 0;
the rendered DaemonSet with one bad override at a time (privileged, an extra
hostPath, host namespaces, ...), each of which the PSS check must reject with
the expected control; and a stale and a missing exception.
"""

from __future__ import annotations

import copy
import json
import pathlib
import shutil
import sys
import tempfile
from typing import Any, Callable

import helm_python as helm
from helm_python import _native
import kubernetes_validate
import yaml

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import dashboard_check  # noqa: E402
import monitor_check  # noqa: E402
import go_values_check  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "amd-gpu"
# packaging/image/build.sh builds it (packaging/common.sh names it).
DEFAULT_IMAGE = "ghcr.io/hami-amd/amd-device-plugin-rs"
CHART_APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
EXCEPTIONS_FILE = CHART / "pss-exceptions.txt"
RELEASE = "amd-gpu"
NAMESPACE = "kube-system"
# 1.30: the oldest with admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy
# (the optional policy needs it); 1.31: a current release.
KUBE_VERSIONS = ["1.30.0", "1.31.0"]
LINT_KUBE_VERSION = "v1.31.0"

PASSED: list[str] = []
FAILED: list[str] = []


def ok(what: str) -> None:
    PASSED.append(what)
    print(f"  ok    {what}")


def bad(what: str) -> None:
    FAILED.append(what)
    print(f"  FAIL  {what}")


def check(cond: bool, what: str, detail: str = "") -> bool:
    if cond:
        ok(what)
    else:
        bad(f"{what}{': ' + detail if detail else ''}")
    return cond


# --------------------------------------------------------------------------
# Pod Security Standards, "restricted" profile (which includes "baseline").
# https://kubernetes.io/docs/concepts/security/pod-security-standards/
# --------------------------------------------------------------------------

BASELINE_CAPS = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}
RESTRICTED_ADD_CAPS = {"NET_BIND_SERVICE"}
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes",
}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
RESTRICTED_VOLUME_TYPES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
    "persistentVolumeClaim", "projected", "secret",
}
SECCOMP_OK = {"RuntimeDefault", "Localhost"}
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"

# Every control the check covers, printed so the log says what was checked.
PSS_CONTROLS = [
    "baseline/hostProcess", "baseline/hostNamespaces", "baseline/privileged",
    "baseline/capabilities", "baseline/hostPathVolumes", "baseline/hostPorts",
    "baseline/appArmor", "baseline/seLinux", "baseline/procMount",
    "baseline/seccomp", "baseline/sysctls", "restricted/volumeTypes",
    "restricted/allowPrivilegeEscalation", "restricted/runAsNonRoot",
    "restricted/runAsUser", "restricted/seccomp", "restricted/capabilities",
]


class Violation:
    def __init__(self, control: str, detail: str, volume: str | None = None,
                 container: tuple[str, str] | None = None):
        self.control, self.detail, self.volume = control, detail, volume
        # (kind, name), e.g. ("initContainers", "hook-installer"), for a container's violation.
        self.container = container

    def __repr__(self) -> str:
        return f"{self.control}: {self.detail}"


def pss_violations(template: dict[str, Any]) -> list[Violation]:
    """Checks a pod template (metadata + spec) against PSS restricted."""
    meta = template.get("metadata") or {}
    spec = template.get("spec") or {}
    annotations = meta.get("annotations") or {}
    psc = spec.get("securityContext") or {}
    out: list[Violation] = []
    current: list[tuple[str, str] | None] = [None]  # the container being checked

    def add(control: str, detail: str, volume: str | None = None) -> None:
        out.append(Violation(control, detail, volume, current[0]))

    containers = [
        (kind, c)
        for kind in ("containers", "initContainers", "ephemeralContainers")
        for c in spec.get(kind) or []
    ]

    # baseline/hostProcess
    if (psc.get("windowsOptions") or {}).get("hostProcess"):
        add("baseline/hostProcess", "spec.securityContext.windowsOptions.hostProcess")
    # baseline/hostNamespaces
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            add("baseline/hostNamespaces", f"spec.{field}=true")
    # baseline/sysctls
    for sysctl in psc.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            add("baseline/sysctls", f"unsafe sysctl {sysctl.get('name')}")
    # baseline/seLinux (pod level)
    def selinux(opts: dict[str, Any] | None, where: str) -> None:
        opts = opts or {}
        if opts.get("type", "") not in SELINUX_TYPES:
            add("baseline/seLinux", f"{where}.seLinuxOptions.type={opts.get('type')}")
        for field in ("user", "role"):
            if opts.get(field):
                add("baseline/seLinux", f"{where}.seLinuxOptions.{field} is set")
    selinux(psc.get("seLinuxOptions"), "spec.securityContext")
    # baseline/appArmor (pod level field and the annotations)
    def apparmor(profile: dict[str, Any] | None, where: str) -> None:
        if profile and profile.get("type") not in ("RuntimeDefault", "Localhost"):
            add("baseline/appArmor", f"{where}.appArmorProfile.type={profile.get('type')}")
    apparmor(psc.get("appArmorProfile"), "spec.securityContext")
    for key, value in annotations.items():
        if key.startswith(APPARMOR_ANNOTATION):
            if value != "runtime/default" and not str(value).startswith("localhost/"):
                add("baseline/appArmor", f"annotation {key}={value}")
    # baseline/seccomp and restricted/seccomp (pod level; legacy annotation too)
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type")
    if pod_seccomp == "Unconfined":
        add("baseline/seccomp", "spec.securityContext.seccompProfile.type=Unconfined")
    for key in ("seccomp.security.alpha.kubernetes.io/pod",):
        if annotations.get(key) == "unconfined":
            add("baseline/seccomp", f"annotation {key}=unconfined")
    # runAsNonRoot / runAsUser (pod level)
    pod_non_root = psc.get("runAsNonRoot")
    if pod_non_root is False:
        add("restricted/runAsNonRoot", "spec.securityContext.runAsNonRoot=false")
    if psc.get("runAsUser") == 0:
        add("restricted/runAsUser", "spec.securityContext.runAsUser=0")

    # volumes
    for vol in spec.get("volumes") or []:
        name = vol.get("name")
        kinds = set(vol) - {"name"}
        if "hostPath" in kinds:
            add("baseline/hostPathVolumes", f"volume {name} is hostPath {vol['hostPath'].get('path')}", name)
        if not kinds or not kinds <= RESTRICTED_VOLUME_TYPES:
            add("restricted/volumeTypes", f"volume {name} has type {sorted(kinds)}", name)

    # containers
    for kind, c in containers:
        current[0] = (kind, c.get("name"))
        where = f"spec.{kind}[{c.get('name')}]"
        sc = c.get("securityContext") or {}
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            add("baseline/hostProcess", f"{where}.securityContext.windowsOptions.hostProcess")
        if sc.get("privileged"):
            add("baseline/privileged", f"{where}.securityContext.privileged=true")
        caps = sc.get("capabilities") or {}
        for cap in caps.get("add") or []:
            if cap not in BASELINE_CAPS:
                add("baseline/capabilities", f"{where} adds {cap}")
            if cap not in RESTRICTED_ADD_CAPS:
                add("restricted/capabilities", f"{where} adds {cap} (only NET_BIND_SERVICE allowed)")
        if "ALL" not in (caps.get("drop") or []):
            add("restricted/capabilities", f"{where} does not drop ALL")
        for port in c.get("ports") or []:
            if port.get("hostPort"):
                add("baseline/hostPorts", f"{where} hostPort {port['hostPort']}")
        selinux(sc.get("seLinuxOptions"), f"{where}.securityContext")
        apparmor(sc.get("appArmorProfile"), f"{where}.securityContext")
        if sc.get("procMount", "Default") != "Default":
            add("baseline/procMount", f"{where}.securityContext.procMount={sc['procMount']}")
        c_seccomp = (sc.get("seccompProfile") or {}).get("type")
        if c_seccomp == "Unconfined":
            add("baseline/seccomp", f"{where}.securityContext.seccompProfile.type=Unconfined")
        if c_seccomp is not None and c_seccomp not in SECCOMP_OK:
            add("restricted/seccomp", f"{where}.securityContext.seccompProfile.type={c_seccomp}")
        if c_seccomp is None and pod_seccomp not in SECCOMP_OK:
            add("restricted/seccomp", f"{where} has no RuntimeDefault/Localhost seccomp profile (nor the pod)")
        if sc.get("allowPrivilegeEscalation") is not False:
            add("restricted/allowPrivilegeEscalation", f"{where}.securityContext.allowPrivilegeEscalation is not false")
        c_non_root = sc.get("runAsNonRoot")
        if c_non_root is False or (c_non_root is None and pod_non_root is not True):
            add("restricted/runAsNonRoot", f"{where} may run as root (runAsNonRoot not true)")
        if sc.get("runAsUser") == 0:
            add("restricted/runAsUser", f"{where}.securityContext.runAsUser=0")
    return out


# What an "initContainer:NAME" line of pss-exceptions.txt allows that container: to run as root.
INIT_CONTAINER_ALLOWED = {"restricted/runAsNonRoot", "restricted/runAsUser"}


def read_exceptions() -> list[str]:
    """hostPath volume names, and "initContainer:NAME" entries."""
    names = []
    for line in EXCEPTIONS_FILE.read_text().splitlines():
        text = line.split("#", 1)[0].strip()
        if text:
            names.append(text.split()[0])
    return names


def pss_verdict(template: dict[str, Any], exceptions: list[str]
                ) -> tuple[list[Violation], list[Violation], list[str]]:
    """The violations an exception covers, those it does not, and the stale
    exceptions (names that are not a hostPath volume, or init containers that
    are not init containers, of the template)."""
    spec = template.get("spec") or {}
    host_paths = {v["name"] for v in spec.get("volumes") or [] if "hostPath" in v}
    inits = {f"initContainer:{c.get('name')}" for c in spec.get("initContainers") or []}
    allowed_controls = {"baseline/hostPathVolumes", "restricted/volumeTypes"}
    allowed, unexpected = [], []
    for v in pss_violations(template):
        covered = v.control in allowed_controls and v.volume in exceptions and v.volume in host_paths
        if v.container and v.container[0] == "initContainers":
            entry = f"initContainer:{v.container[1]}"
            covered = covered or (v.control in INIT_CONTAINER_ALLOWED and entry in exceptions)
        (allowed if covered else unexpected).append(v)
    stale = [name for name in exceptions
             if name not in host_paths and name not in inits]
    return allowed, unexpected, stale


# --------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------

def render(chart: helm.Chart, values: dict[str, Any] | None,
           kube_version: str | None = None) -> list[dict[str, Any]]:
    """Renders like `helm template`; with kube_version, as for a cluster of that
    version (.Capabilities.KubeVersion). Chart.render() has no such option, so
    that case calls the library's helm_render with the render option
    kube_version that libhelm_c accepts (private API of helm-python-sdk 0.2.2,
    hence the pinned version in .ci/chart-check)."""
    if kube_version is None:
        manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    else:
        opts = {"name": RELEASE, "namespace": NAMESPACE, "is_install": True,
                "kube_version": f"v{kube_version}"}
        manifests = json.loads(_native.call_string(
            "helm_render", chart._raw(), None if values is None else json.dumps(values),
            json.dumps(opts)))
    objects = []
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                doc.setdefault("__source", path)
                objects.append(doc)
    return objects


def strip(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k != "__source"}


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def deep_merge(base: Any, patch: Any) -> Any:
    """Merges patch into base; lists merge item by item (like a strategic
    merge of containers by position), so a patch can touch one container."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for key, value in patch.items():
            merged[key] = deep_merge(base[key], value) if key in base else copy.deepcopy(value)
        return merged
    if isinstance(base, list) and isinstance(patch, list):
        merged = list(base)
        for i, value in enumerate(patch):
            if i < len(merged):
                merged[i] = deep_merge(merged[i], value)
            else:
                merged.append(copy.deepcopy(value))
        return merged
    return copy.deepcopy(patch)


# --------------------------------------------------------------------------
# Checks of one value set
# --------------------------------------------------------------------------

EXPECTED_RULES = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
]
# dp.reportNodeCapacity: the node's capacity and allocatable.
NODE_STATUS_RULE = {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]}


def expected_rules(values: dict[str, Any]) -> list[dict[str, Any]]:
    return EXPECTED_RULES + ([NODE_STATUS_RULE] if values["dp"].get("reportNodeCapacity") else [])


def hook_dir(values: dict[str, Any]) -> str:
    """<dp.hostHookPath>/vgpu: the Go chart's hostHookPath is a prefix."""
    return values["dp"]["hostHookPath"].rstrip("/") + "/vgpu"


def log_filter(dp: dict[str, Any]) -> str:
    """dp.logLevel, else from the Go plugin's glog verbosity dp.logVerbosity."""
    if dp.get("logLevel"):
        return dp["logLevel"]
    verbosity = dp.get("logVerbosity") or 2
    return "info,plugin=trace" if verbosity >= 5 else "info,plugin=debug" if verbosity >= 3 else "info"


def node_selector(values: dict[str, Any]) -> dict[str, str]:
    """nodeSelector, with node_selector when node_selector_enabled (the Go chart's keys)."""
    selector = dict(values.get("nodeSelector") or {})
    if values.get("node_selector_enabled"):
        selector.update(values.get("node_selector") or {})
    return selector


# Values as the seed (and HAMi's Go chart) documents them: accepted, and
# rendered to what the plugin understands.
SEED_SPELLINGS: dict[str, Any] = {
    "dp": {
        "dmemBackend": True,
        "healthPulse": 0,
        "allocatorPolicy": "binpack",
        "muslFailClosed": {"enabled": False},
    },
}


# The protected annotations' writers set: listed writers and device plugins,
# HAMi in two namespaces (the default set lists none of the first).
POLICY_WRITERS: dict[str, Any] = {
    "validatingAdmissionPolicy": {
        "enabled": True,
        "hamiNamespaces": ["hami-system", "kube-system"],
        "writers": {"serviceAccounts": ["volcano-system:volcano-scheduler"],
                    "users": ["system:kube-scheduler"]},
        "devicePlugins": {"serviceAccounts": ["gpu-operator:vendor-device-plugin"],
                          "users": ["vendor-plugin"]},
    },
}


def expected_env(values: dict[str, Any]) -> dict[str, str | None]:
    dp = values["dp"]
    kubelet = values["kubeletRootDir"]
    return {
        "NODE_NAME": None,  # downward API, checked separately
        "AMDGPU_DP_KUBE": "auto",
        "AMDGPU_DP_SPLIT_COUNT": str(dp["splitCount"]),
        "AMDGPU_DP_ALLOCATOR_POLICY": dp["allocatorPolicy"],
        # A YAML boolean (the seed chart's spelling) renders as "true"/"false".
        "AMDGPU_DP_DMEM_BACKEND": (str(dp["dmemBackend"]).lower()
                                   if isinstance(dp["dmemBackend"], bool) else dp["dmemBackend"]),
        "AMDGPU_DP_CDI": "true" if dp["cdi"]["enabled"] else "false",
        "AMDGPU_DP_LOADER_CHECK": "true" if dp["muslFailClosed"]["enabled"] else "false",
        "AMDGPU_DP_ANNOTATIONS_PROTECTED":
            "true" if values["validatingAdmissionPolicy"]["enabled"] else "false",
        "AMDGPU_DP_HEALTH_PULSE": str(dp["healthPulse"]),
        "AMDGPU_DP_HIP_LOG_LEVEL": str(dp.get("hipLogLevel", 0)),
        "OPERATING_MODE": dp["operatingMode"],
        **({"COMPUTE_PARTITION": dp["computePartition"]} if dp["computePartition"] else {}),
        "AMDGPU_DP_SANDBOX": dp["sandbox"],
        "AMDGPU_DP_METRICS_ADDRESS": monitor_check.metrics_address(values),
        "AMDGPU_DP_PROBE_ADDRESS": f"0.0.0.0:{dp['probes']['port']}",
        "AMDGPU_DP_LOG": log_filter(dp),
        "AMDGPU_DP_HOOK_PATH": hook_dir(values),
        **({"AMDGPU_DP_EXCLUDE_GPUS": ",".join(dp["excludeGPUs"])} if dp.get("excludeGPUs") else {}),
        "AMDGPU_DP_REPORT_NODE_CAPACITY": "true" if dp.get("reportNodeCapacity") else "false",
        "AMDGPU_DP_KUBELET_DIR": f"{kubelet}/device-plugins",
        "AMDGPU_DP_POD_RESOURCES_SOCKET": f"{kubelet}/pod-resources/kubelet.sock",
        "AMDGPU_DP_BUS_ADDRESS": f"unix:path={values['dbusSocketDir']}/system_bus_socket",
    }


def check_ports(container: dict[str, Any], values: dict[str, Any]) -> None:
    """Two named ports, metrics and probes (issue 38, F5: peers filling the
    metrics port's connections failed the liveness probe that shared them);
    the probes on theirs."""
    metrics, probes = monitor_check.metrics_port(values), values["dp"]["probes"]["port"]
    ports = container.get("ports") or []
    check(sorted((p.get("name"), p.get("containerPort")) for p in ports)
          == [("metrics", metrics), ("probes", probes)]
          and metrics != probes and not any(p.get("hostPort") for p in ports),
          f"containerPorts metrics {metrics} and probes {probes}, no hostPort", str(ports))
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = (container.get(probe) or {}).get("httpGet") or {}
        check(get.get("path") == path and get.get("port") in ("probes", probes),
              f"{probe} GET {path} on the probe port, not the metrics port", str(get))


SHARED_KEYS = ["hami.io/vgpu-node", "hami.io/vgpu-time", "hami.io/bind-phase", "hami.io/bind-time"]


def writer_users(writers: dict[str, Any]) -> list[str]:
    """The API server's user names of a writers/devicePlugins value."""
    return ([f"system:serviceaccount:{sa}" for sa in writers.get("serviceAccounts") or []]
            + list(writers.get("users") or []))


def listed(expression: str, before: str) -> list[Any] | None:
    """The JSON list literal right after `before` in a CEL expression (the
    chart writes its lists with toJson), or None."""
    at = expression.find(before)
    if at < 0:
        return None
    try:
        return json.JSONDecoder().raw_decode(expression, at + len(before))[0]
    except ValueError:
        return None


def check_protected_annotations(policies: list[dict[str, Any]], sa_user: str,
                                values: dict[str, Any]) -> None:
    """The policies that keep HAMi's and the plugin's pod annotations to them:
    one on pods and their status (issue 38, F4), the AMD keys on every pod and
    the shared ones on pods asking for amd.com/ resources (issue 37, point 3);
    one on Bindings, whose annotations the API server copies onto the pod."""
    by_name = {p["metadata"]["name"].rsplit("-protected-", 1)[-1]: p["spec"] for p in policies}
    if not check(sorted(by_name) == ["annotations", "bindings"],
                 "two policies protect HAMi's pod annotations (pods, Bindings)", str(sorted(by_name))):
        return
    pods, bindings = by_name["annotations"], by_name["bindings"]
    rules = pods["matchConstraints"]["resourceRules"]
    check([r["resources"] for r in rules] == [["pods", "pods/status"]]
          and [r["operations"] for r in rules] == [["CREATE", "UPDATE"]],
          "the pods' policy matches pod and pods/status CREATE and UPDATE", str(rules))
    rules = bindings["matchConstraints"]["resourceRules"]
    check([r["resources"] for r in rules] == [["pods/binding", "bindings"]]
          and [r["operations"] for r in rules] == [["CREATE"]],
          "the Bindings' policy matches pods/binding and bindings CREATE", str(rules))
    check(pods["failurePolicy"] == bindings["failurePolicy"] == "Fail", "both fail closed")
    vap = values["validatingAdmissionPolicy"]
    writers = writer_users(vap.get("writers") or {}) + [sa_user]
    namespaces = vap.get("hamiNamespaces") or []
    for spec, what in ((pods, "pods"), (bindings, "Bindings")):
        exempt = spec["matchConditions"][0]["expression"]
        check(sorted(listed(exempt, "request.userInfo.username in ") or []) == sorted(writers)
              and listed(exempt, "split(':')[2] in ") == namespaces
              and "contains('hami')" in exempt and "endsWith('-scheduler')" in exempt,
              f"{what}: it exempts the plugin, {writers[:-1] or 'no other listed writer'} and "
              f"HAMi's scheduler by name in {namespaces}", exempt)
        variables = {v["name"]: v["expression"] for v in spec["variables"]}
        check(all(f"'{k}'" in variables.get("shared", "") for k in SHARED_KEYS),
              f"{what}: the shared keys are {', '.join(SHARED_KEYS)}")
        check("k.startsWith('hami.io/amd-')" in variables.get("touched", ""),
              f"{what}: every hami.io/amd-* key is protected")
    variables = {v["name"]: v["expression"] for v in pods["variables"]}
    amd = variables.get("amdPod", "")
    check(all(s in amd for s in ("initContainers", "limits", "requests", "'amd.com/'", "oldObject")),
          "pods: the shared keys only where a container or init container asks for amd.com/ "
          "(limits or requests, before or after the update)", amd)
    check("variables.amdPod ?" in variables.get("guarded", ""),
          "pods: the shared keys are guarded only on AMD pods", variables.get("guarded", ""))
    plugins = writer_users(vap.get("devicePlugins") or {})
    device = variables.get("devicePlugin", "")
    check(sorted(listed(device, "request.userInfo.username in ") or []) == sorted(plugins)
          and "endsWith('-device-plugin')" in device
          and listed(device, "split(':')[2] in ") == namespaces,
          f"pods: device plugins {plugins} and HAMi's by name may set bind-phase", device)
    check("k == 'hami.io/bind-phase'" in variables.get("guarded", ""),
          "pods: a device plugin may set hami.io/bind-phase and nothing else")
    binding_vars = {v["name"]: v["expression"] for v in bindings["variables"]}
    check("amdPod" not in binding_vars and "k in variables.shared" in binding_vars.get("touched", ""),
          "Bindings: every protected key refused (a Binding does not show the pod's resources)")


def plugin_ds(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The plugin's DaemonSet (component device-plugin), not the node installer."""
    found = [o for o in objects if o["kind"] == "DaemonSet"
             and o["metadata"]["labels"].get("app.kubernetes.io/component") == "device-plugin"]
    assert len(found) == 1, f"expected one device-plugin DaemonSet, found {len(found)}"
    return found[0]


def check_hook_installer(values: dict[str, Any], spec: dict[str, Any]) -> None:
    """dp.hookInstaller: off renders no init container; on renders exactly the
    copy from dp.image into <dp.hostHookPath>/vgpu, as root without
    capabilities."""
    inits = spec.get("initContainers") or []
    hook = values["dp"]["hookInstaller"]
    if not hook["enabled"]:
        check(not inits, "hookInstaller off: no init container")
        return
    if not check(len(inits) == 1 and inits[0]["name"] == "hook-installer",
                 "hookInstaller on: one init container, hook-installer", str(inits)):
        return
    c = inits[0]
    image = values["dp"]["image"]
    want_image = f"{image['repository']}:{image['tag'] or '0.0.1'}"
    dst = f"{hook_dir(values)}/libamvgpu.so"
    check(c["image"] == want_image, f"hook-installer image {want_image}", c["image"])
    check(c.get("command", [])[:2] == ["sh", "-c"] and c["command"][3:] == [hook["sourcePath"], dst]
          and "mv -f" in c["command"][2],
          f"hook-installer copies {hook['sourcePath']} to {dst}, renaming over the old one",
          str(c.get("command")))
    mounts = c.get("volumeMounts") or []
    check(mounts == [{"name": "vgpu-hook", "mountPath": hook_dir(values)}],
          "hook-installer mounts only <dp.hostHookPath>/vgpu, read-write", str(mounts))
    sc = c.get("securityContext") or {}
    check(sc.get("runAsUser") == 0 and sc.get("capabilities", {}).get("drop") == ["ALL"]
          and not sc.get("capabilities", {}).get("add") and sc.get("privileged") is False
          and sc.get("allowPrivilegeEscalation") is False and sc.get("readOnlyRootFilesystem") is True,
          "hook-installer: root (the named privilege), no capability, not privileged, read-only root",
          str(sc))


# The node installer's privileges, as values.yaml names them (privileged, hostPID, the host's /
# read-write, root): exactly these Pod Security controls fail for its pods, no others.
NODE_INSTALLER_CONTROLS = {
    "baseline/privileged", "baseline/hostNamespaces", "baseline/hostPathVolumes",
    "restricted/volumeTypes", "restricted/runAsNonRoot", "restricted/runAsUser",
    "restricted/allowPrivilegeEscalation", "restricted/capabilities", "restricted/seccomp",
}


def check_node_installer(objects: list[dict[str, Any]], values: dict[str, Any],
                         plugin: dict[str, Any]) -> None:
    found = [o for o in objects if o["kind"] == "DaemonSet" and o is not plugin]
    if not check(len(found) == 1, "nodeInstaller on: one more DaemonSet"):
        return
    ds = found[0]
    template = ds["spec"]["template"]
    spec = template["spec"]
    name = f"{plugin['metadata']['name']}-node-installer"
    check(ds["metadata"]["name"] == name and ds["metadata"].get("namespace") == NAMESPACE
          and ds["metadata"]["labels"].get("app.kubernetes.io/component") == "node-installer",
          f"DaemonSet {name} in the release namespace, component node-installer")
    sel, psel = ds["spec"]["selector"]["matchLabels"], plugin["spec"]["selector"]["matchLabels"]
    labels, plabels = template["metadata"]["labels"], plugin["spec"]["template"]["metadata"]["labels"]
    check(not all(labels.get(k) == v for k, v in psel.items())
          and not all(plabels.get(k) == v for k, v in sel.items())
          and all(labels.get(k) == v for k, v in sel.items()),
          "neither DaemonSet's selector matches the other's pods", f"{sel} / {psel}")
    violated = {v.control for v in pss_violations(template)}
    check(violated == NODE_INSTALLER_CONTROLS,
          "its Pod Security violations are exactly the named privileges",
          f"extra {sorted(violated - NODE_INSTALLER_CONTROLS)}, missing {sorted(NODE_INSTALLER_CONTROLS - violated)}")
    check(spec.get("hostPID") is True and not spec.get("hostNetwork") and not spec.get("hostIPC"),
          "hostPID, not the host's network or IPC")
    check(spec.get("volumes") == [{"name": "host", "hostPath": {"path": "/", "type": "Directory"}}],
          "one hostPath volume: the host's /", str(spec.get("volumes")))
    check(spec.get("automountServiceAccountToken") is False, "no API token")
    check(not spec.get("initContainers") and len(spec["containers"]) == 1, "one container")
    c = spec["containers"][0]
    image = values["nodeInstaller"]["image"]
    want_image = f"{image['repository']}:{image['tag'] or CHART_APP_VERSION}"
    check(c["image"] == want_image, f"image {want_image}", c["image"])
    check(c.get("args") == ["run"] and not c.get("command"), "runs the image's entrypoint with 'run'")
    check(c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command")
          == ["/bin/sh", "/usr/share/amd-gpud-node-installer/node-installer.sh", "prestop"],
          "preStop removes amd-gpud (node-installer.sh prestop)")
    check(c.get("volumeMounts") == [{"name": "host", "mountPath": "/host"}]
          and {"name": "HOST_ROOT", "value": "/host"} in c.get("env", []),
          "the host's / at /host, HOST_ROOT=/host")
    sc = c.get("securityContext") or {}
    check(sc.get("privileged") is True and sc.get("runAsUser") == 0, "privileged, root")
    for key in ("nodeSelector", "tolerations", "affinity"):
        check(spec.get(key) == plugin["spec"]["template"]["spec"].get(key),
              f"the same {key} as the plugin")


def check_value_set(chart: helm.Chart, label: str, overrides: dict[str, Any] | None,
                    exceptions: list[str]) -> dict[str, Any] | None:
    print(f"\n== value set '{label}'")
    values = chart.merge_values(overrides)
    try:
        chart.validate_schema(overrides)
        ok("values match values.schema.json")
    except helm.HelmError as err:
        bad(f"values do not match the schema: {err}")
        return None

    report = helm.lint(CHART, overrides, strict=True, namespace=NAMESPACE,
                       kube_version=LINT_KUBE_VERSION)
    problems = [m for m in report["messages"] if m["severity"] >= 2] + [
        {"severity": 3, "path": "", "error": e} for e in report["errors"]
    ]
    for m in report["messages"]:
        if m["severity"] < 2:
            print(f"        lint info: {m['path']}: {m['error']}")
    check(not problems, f"helm lint --strict (kube {LINT_KUBE_VERSION})", str(problems))

    try:
        objects = render(chart, overrides)
    except helm.HelmError as err:
        bad(f"render failed: {err}")
        return None
    kinds = sorted(f"{o['kind']}/{o['metadata']['name']}" for o in objects)
    print(f"        rendered: {', '.join(kinds)}")

    # Kubernetes schemas, strict (unknown fields are errors), each on a render
    # for a cluster of that version.
    for version in KUBE_VERSIONS:
        errors = []
        try:
            versioned = render(chart, overrides, version)
        except helm.HelmError as err:
            bad(f"render for Kubernetes {version} failed: {err}")
            continue
        check(sorted(map(strip, versioned), key=repr) == sorted(map(strip, objects), key=repr),
              f"the render for Kubernetes {version} equals the default render")
        for obj in versioned:
            if monitor_check.skip_schema(obj):
                continue
            try:
                kubernetes_validate.validate(strip(obj), version, strict=True)
            except kubernetes_validate.ValidationError as err:
                path = ".".join(str(p) for p in err.path)
                errors.append(f"{obj['kind']}/{obj['metadata']['name']}: {path}: {err.message}")
            except kubernetes_validate.SchemaNotFoundError as err:
                errors.append(f"{obj['kind']}/{obj['metadata']['name']}: no schema: {err.message}")
        check(not errors, f"{len(versioned)} objects valid against Kubernetes {version} (strict)",
              "; ".join(errors))

    # The objects.
    vap = values["validatingAdmissionPolicy"]["enabled"]
    netpol = values["networkPolicy"]["enabled"]
    installer = values["nodeInstaller"]["enabled"]
    hook = values["dp"]["hookInstaller"]["enabled"]
    sa_created = values["dp"]["serviceAccount"]["create"]
    # dp.reportNodeCapacity: patch on nodes/status, and a policy keeping it to the node.
    capacity = 1 if values["dp"].get("reportNodeCapacity") else 0
    want = {"ServiceAccount": 1 if sa_created else 0, "ClusterRole": 1, "ClusterRoleBinding": 1,
            "DaemonSet": 2 if installer else 1,
            "NetworkPolicy": 1 if netpol else 0,
            "ValidatingAdmissionPolicy": (4 + capacity) if vap else 0,
            "ValidatingAdmissionPolicyBinding": (4 + capacity) if vap else 0,
            "ConfigMap": 1 if values["dashboard"]["enabled"] else 0,
            **monitor_check.expected_counts(values)}
    have = {k: sum(1 for o in objects if o["kind"] == k) for k in want}
    extra = sorted({o["kind"] for o in objects} - set(want))
    check(have == want and not extra, "the expected objects and no others",
          f"have {have}, extra {extra}")
    for obj in objects:
        if obj["kind"] in ("ServiceAccount", "DaemonSet"):
            check(obj["metadata"].get("namespace") == NAMESPACE,
                  f"{obj['kind']} is in the release namespace")

    check_dashboard_configmap(objects, values)
    ds = plugin_ds(objects)
    template = ds["spec"]["template"]
    spec = template["spec"]
    sa = values["dp"]["serviceAccount"]["name"] or ds["metadata"]["name"]
    if sa_created:
        account = one(objects, "ServiceAccount")["metadata"]
        check(account["name"] == sa
              and account.get("annotations", {}) == values["dp"]["serviceAccount"]["annotations"],
              f"ServiceAccount {sa} with dp.serviceAccount's annotations")
    sa_user = f"system:serviceaccount:{NAMESPACE}:{sa}"

    # RBAC: exactly what the code needs, bound to the plugin's ServiceAccount.
    role = one(objects, "ClusterRole")
    check(role["rules"] == expected_rules(values), "ClusterRole has exactly the rules the plugin needs",
          str(role["rules"]))
    binding = one(objects, "ClusterRoleBinding")
    check(binding["roleRef"]["name"] == role["metadata"]["name"]
          and binding["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}],
          "ClusterRoleBinding binds the ClusterRole to the plugin's ServiceAccount only")
    check(spec.get("serviceAccountName") == sa, "the pod runs as the chart's ServiceAccount")

    # The policies, when on.
    if vap:
        every_policy = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"]
        bindings = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"]
        protected = [p for p in every_policy
                     if p["metadata"]["name"].endswith(("-protected-annotations",
                                                        "-protected-bindings"))]
        policies = [p for p in every_policy if p not in protected]
        check_protected_annotations(protected, sa_user, values)
        resources = sorted(r for p in policies
                           for rule in p["spec"]["matchConstraints"]["resourceRules"]
                           for r in rule["resources"])
        want_resources = ["nodes"] + (["nodes/status"] if capacity else []) + ["pods"]
        check(resources == want_resources, f"policies cover {', '.join(want_resources)}",
              str(resources))
        if capacity:
            status = next(p["spec"] for p in policies
                          if p["metadata"]["name"].endswith("-own-node-status"))
            rules = " ".join(v["expression"] for v in status["validations"])
            check("object.metadata.name == variables.userNode" in rules
                  and "object.spec == oldObject.spec" in rules
                  and "object.metadata.labels == oldObject.metadata.labels" in rules
                  and "k in variables.amd" in rules
                  and "object.status.conditions == oldObject.status.conditions" in rules
                  and {"name": "amd", "expression": "['amd.com/gpumem', 'amd.com/gpucores']"}
                  in status["variables"],
                  "nodes/status: its own node, only amd.com/gpumem and amd.com/gpucores "
                  "in capacity and allocatable, nothing else of the node")
        check(all(r["operations"] == ["UPDATE"] for p in policies
                  for r in p["spec"]["matchConstraints"]["resourceRules"]),
              "policies match UPDATE (PATCH) only")
        check(all(p["spec"]["failurePolicy"] == "Fail" for p in policies), "policies fail closed")
        check(all(sa_user in p["spec"]["matchConditions"][0]["expression"] for p in policies),
              f"policies match only {sa_user}")
        check(all("authentication.kubernetes.io/node-name" in v["expression"]
                  for p in policies for v in p["spec"]["variables"] if v["name"] == "userNode"),
              "policies take the node from the token's node-name extra")
        check(sorted(b["spec"]["policyName"] for b in bindings)
              == sorted(p["metadata"]["name"] for p in every_policy)
              and all(b["spec"]["validationActions"] == ["Deny"] for b in bindings),
              "each policy has a binding with validationActions [Deny]")

    # The NetworkPolicy, when on: ingress to the plugin's pods only on the
    # metrics port, only from networkPolicy.metricsFrom (none when empty).
    if netpol:
        policy = one(objects, "NetworkPolicy")["spec"]
        want_ingress = monitor_check.want_ingress(values)
        check(policy["podSelector"]["matchLabels"] == ds["spec"]["selector"]["matchLabels"]
              and policy["policyTypes"] == ["Ingress"] and policy["ingress"] == want_ingress,
              "NetworkPolicy admits only metricsFrom, only to the metrics port (never the "
              "probes'), only while monitor.enabled", str(policy))
    monitor_check.check_monitor(check, objects, values, ds, RELEASE, NAMESPACE)

    # The image: this project's own (the Go plugin's image is another program).
    container = spec["containers"][0]
    image = values["image"]
    want_image = f"{image['repository']}:{image['tag'] or CHART_APP_VERSION}"
    check(container["image"] == want_image, f"the plugin's image is {want_image}", container["image"])
    if overrides is None:
        check(want_image == f"{DEFAULT_IMAGE}:{CHART_APP_VERSION}",
              f"the default image is this project's ({DEFAULT_IMAGE}, tag appVersion)", want_image)

    # The plugin's environment.
    env = {e["name"]: e for e in container.get("env") or []}
    want_env = expected_env(values)
    check(set(env) == set(want_env), "the container's variables are exactly the expected ones",
          f"missing {sorted(set(want_env) - set(env))}, extra {sorted(set(env) - set(want_env))}")
    wrong = {k: (env[k].get("value"), v) for k, v in want_env.items()
             if v is not None and k in env and env[k].get("value") != v}
    check(not wrong, "each value maps to its variable", str(wrong))
    check(env.get("NODE_NAME", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
          == "spec.nodeName", "NODE_NAME comes from the downward API (spec.nodeName)")
    check(not container.get("args") and not container.get("command"),
          "the container gets no arguments")

    # Hardening the PSS check does not cover.
    csc = container.get("securityContext") or {}
    psc = spec.get("securityContext") or {}
    check(csc.get("readOnlyRootFilesystem") is True, "readOnlyRootFilesystem")
    check(psc.get("runAsUser") == csc.get("runAsUser") == values["runAsUser"]
          and psc.get("runAsGroup") == csc.get("runAsGroup") == values["runAsGroup"],
          f"runs as {values['runAsUser']}:{values['runAsGroup']} (the amdgpu-plugin user)")
    check(psc.get("seccompProfile", {}).get("type") == "RuntimeDefault"
          and csc.get("seccompProfile", {}).get("type") == "RuntimeDefault",
          "seccomp RuntimeDefault at pod and container level")
    check(spec.get("automountServiceAccountToken") is True, "the pod mounts its API token")
    check(spec.get("hostUsers", True) is True, "no user namespace (hostUsers not false)")
    check(template["metadata"]["labels"].get("hami.io/webhook") == "ignore",
          "pods carry hami.io/webhook=ignore (HAMi's webhook skips them)")
    check_ports(container, values)
    check(spec.get("nodeSelector", {}) == node_selector(values),
          "nodeSelector: nodeSelector, and node_selector when node_selector_enabled",
          str(spec.get("nodeSelector")))
    check(container.get("resources", {}) == (values["dp"]["resources"] or values["resources"]),
          "resources: dp.resources, else resources", str(container.get("resources")))
    check(ds["spec"].get("updateStrategy")
          == (values["dp"]["updateStrategy"] or values["updateStrategy"]),
          "updateStrategy: dp.updateStrategy, else updateStrategy", str(ds["spec"].get("updateStrategy")))
    mounts = {m["name"]: m for m in container.get("volumeMounts") or []}
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    want_mounts = {
        "device-plugins": (f"{values['kubeletRootDir']}/device-plugins", False),
        "pod-resources": (f"{values['kubeletRootDir']}/pod-resources", True),
        "dbus": (values["dbusSocketDir"], True),
        "vgpu-hook": (hook_dir(values), True),
    }
    have_mounts = {
        name: (volumes.get(name, {}).get("hostPath", {}).get("path"), bool(m.get("readOnly")))
        for name, m in mounts.items()
    }
    check(have_mounts == want_mounts and set(volumes) == set(want_mounts),
          "hostPath volumes and mounts: device-plugins rw; pod-resources, dbus, vgpu-hook ro",
          f"{have_mounts}")
    check(all(mounts[n]["mountPath"] == volumes[n]["hostPath"]["path"] for n in mounts if n in volumes),
          "each host directory is mounted at its host path")

    # Pod Security "restricted".
    allowed, unexpected, stale = pss_verdict(template, exceptions)
    print(f"        PSS restricted controls checked: {', '.join(PSS_CONTROLS)}")
    for v in allowed:
        print(f"        allowed by pss-exceptions.txt: {v}")
    check(not unexpected, "Pod Security restricted: no violation beyond pss-exceptions.txt",
          "; ".join(map(repr, unexpected)))
    if not hook:
        # The init container exists only with dp.hookInstaller.enabled.
        stale = [name for name in stale if not name.startswith("initContainer:")]
    check(not stale, "pss-exceptions.txt has no stale entry", str(stale))

    check_hook_installer(values, spec)
    if installer:
        check_node_installer(objects, values, ds)
    return ds


# --------------------------------------------------------------------------
# Self-tests: the checks must reject what they are meant to reject.
# --------------------------------------------------------------------------

BAD_VALUES = [
    {"bogus": 1},
    {"dp": {"bogus": 1}},
    {"dp": {"allocatorPolicy": "firstfit"}},
    {"dp": {"healthPulse": -1}},
    {"dp": {"muslFailClosed": {"enabled": "no"}}},
    {"dp": {"dmemBackend": "yes"}},
    {"dp": {"operatingMode": "Partition"}},
    {"dp": {"computePartition": "cpx4"}},
    {"dp": {"hipLogLevel": 5}},
    {"dp": {"sandbox": "maybe"}},
    {"dp": {"cdi": {"enabled": "true"}}},
    {"dp": {"metrics": {"port": 80}}},
    {"dp": {"probes": {"port": 80}}},
    {"dp": {"probes": {"port": "9401"}}},
    {"dp": {"splitCount": -1}},
    {"runAsUser": 0},
    {"hostHookPath": "/usr/local/vgpu"},
    {"dp": {"hostHookPath": "usr/local"}},
    {"dp": {"hostHookPath": "/usr/../local"}},
    {"dp": {"excludeGPUs": ["gpu0"]}},
    {"dp": {"excludeGPUs": "card1"}},
    {"dp": {"reportNodeCapacity": "yes"}},
    {"dp": {"logVerbosity": -1}},
    {"dp": {"serviceAccount": {"bogus": 1}}},
    {"dp": {"updateStrategy": {"type": "Recreate"}}},
    {"node_selector_enabled": "yes"},
    {"node_selector": {"a": 1}},
    {"kubeletRootDir": "/var/lib/../kubelet"},
    {"dbusSocketDir": "/run/dbus/"},
    {"validatingAdmissionPolicy": {"enabled": True, "mode": "warn"}},
    {"validatingAdmissionPolicy": {"hamiWriters": ["system:serviceaccount:kube-system:hami-scheduler"]}},
    {"validatingAdmissionPolicy": {"writers": {"serviceAccounts": ["hami-scheduler"]}}},
    {"validatingAdmissionPolicy": {"writers": {"serviceAccounts": ["system:serviceaccount:kube-system:x"]}}},
    {"validatingAdmissionPolicy": {"writers": {"users": [""]}}},
    {"validatingAdmissionPolicy": {"writers": {"groups": ["system:masters"]}}},
    {"validatingAdmissionPolicy": {"devicePlugins": {"serviceAccounts": ["Kube-System:x"]}}},
    {"validatingAdmissionPolicy": {"hamiNamespaces": ["kube_system"]}},
    {"networkPolicy": {"enabled": True, "metricsFrom": [{"anyone": {}}]}},
    {"networkPolicy": {"enabled": "yes", "metricsFrom": []}},
    {"securityContext": {"privileged": True}},
    {"hookInstaller": {"enabled": True}},
    {"dp": {"hookInstaller": {"sourcePath": "libamvgpu.so"}}},
    {"dp": {"hookInstaller": {"bogus": 1}}},
    {"dp": {"image": {"repository": ""}}},
    {"nodeInstaller": {"enabled": "yes"}},
    {"nodeInstaller": {"image": {"repository": ""}}},
    {"nodeInstaller": {"privileged": False}},
]

def merged(patch: dict[str, Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda template: deep_merge(template, patch)


def with_container(patch: dict[str, Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The patch merged into the plugin container (the first one)."""
    return merged({"spec": {"containers": [patch]}})


def extra_host_path(template: dict[str, Any]) -> dict[str, Any]:
    broken = copy.deepcopy(template)
    broken["spec"]["volumes"].append({"name": "sys", "hostPath": {"path": "/sys"}})
    broken["spec"]["containers"][0]["volumeMounts"].append({"name": "sys", "mountPath": "/sys"})
    return broken


BAD_OVERRIDES: list[tuple[str, str, Callable[[dict[str, Any]], dict[str, Any]]]] = [
    ("privileged: true", "baseline/privileged", with_container({"securityContext": {"privileged": True}})),
    ("an extra hostPath volume (/sys)", "baseline/hostPathVolumes", extra_host_path),
    ("hostNetwork", "baseline/hostNamespaces", merged({"spec": {"hostNetwork": True}})),
    ("hostPID", "baseline/hostNamespaces", merged({"spec": {"hostPID": True}})),
    ("hostIPC", "baseline/hostNamespaces", merged({"spec": {"hostIPC": True}})),
    ("a hostPort", "baseline/hostPorts", with_container({"ports": [{"hostPort": 9400}]})),
    ("capability SYS_ADMIN", "baseline/capabilities", with_container({"securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}})),
    ("capability CHOWN (allowed by baseline only)", "restricted/capabilities",
     with_container({"securityContext": {"capabilities": {"add": ["CHOWN"]}}})),
    ("no drop ALL", "restricted/capabilities", with_container({"securityContext": {"capabilities": {"drop": ["NET_RAW"]}}})),
    ("allowPrivilegeEscalation true", "restricted/allowPrivilegeEscalation", with_container({"securityContext": {"allowPrivilegeEscalation": True}})),
    ("runAsNonRoot false", "restricted/runAsNonRoot", with_container({"securityContext": {"runAsNonRoot": False}})),
    ("runAsUser 0", "restricted/runAsUser", merged({"spec": {"securityContext": {"runAsUser": 0}}})),
    ("seccomp Unconfined", "baseline/seccomp", with_container({"securityContext": {"seccompProfile": {"type": "Unconfined"}}})),
    ("an unsafe sysctl", "baseline/sysctls", merged({"spec": {"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}}})),
    ("AppArmor Unconfined", "baseline/appArmor", merged({"spec": {"securityContext": {"appArmorProfile": {"type": "Unconfined"}}}})),
    ("the AppArmor unconfined annotation", "baseline/appArmor",
     merged({"metadata": {"annotations": {APPARMOR_ANNOTATION + "amd-device-plugin": "unconfined"}}})),
    ("an SELinux custom type", "baseline/seLinux", with_container({"securityContext": {"seLinuxOptions": {"type": "spc_t"}}})),
    ("procMount Unmasked", "baseline/procMount", with_container({"securityContext": {"procMount": "Unmasked"}})),
    ("an init container running as root", "restricted/runAsUser",
     merged({"spec": {"initContainers": [{"name": "init", "image": "busybox",
                                          "securityContext": {"runAsUser": 0}}]}})),
]


def rejects(chart: helm.Chart, values: dict[str, Any]) -> bool:
    try:
        chart.validate_schema(values)
        return False
    except helm.HelmValuesError:
        return True


def self_tests(chart: helm.Chart, ds: dict[str, Any], exceptions: list[str]) -> None:
    print("\n== self-tests: the checks must reject bad input")
    for values in BAD_VALUES:
        try:
            chart.validate_schema(values)
            bad(f"schema accepted {values}")
        except helm.HelmValuesError:
            ok(f"schema rejects {values}")

    try:
        render(chart, {"runAsUser": 0})
        bad("the chart renders with runAsUser 0")
    except helm.HelmValuesError:
        ok("the chart refuses to render with runAsUser 0 (schema)")

    # A render through the chart with its schema removed: runAsUser 0 reaches
    # the DaemonSet, and the PSS check must catch it.
    with tempfile.TemporaryDirectory() as tmp:
        copy_dir = pathlib.Path(tmp) / "amd-gpu"
        shutil.copytree(CHART, copy_dir)
        (copy_dir / "values.schema.json").unlink()
        with helm.Chart.load(copy_dir) as unchecked:
            objs = render(unchecked, {"runAsUser": 0, "runAsGroup": 0})
        template = plugin_ds(objs)["spec"]["template"]
        unexpected = pss_verdict(template, exceptions)[1]
        check(any(v.control == "restricted/runAsUser" for v in unexpected),
              "render with runAsUser 0 (schema removed) fails the PSS check",
              "; ".join(map(repr, unexpected)))

    for version in ("1.29.0", "1.25.0"):
        try:
            render(chart, {"validatingAdmissionPolicy": {"enabled": True}}, version)
            bad(f"the admission policy renders for Kubernetes {version}")
        except helm.HelmRenderError as err:
            check("needs Kubernetes 1.30" in str(err),
                  f"the admission policy refuses to render for Kubernetes {version}", str(err))
    loader_ds = plugin_ds(render(chart, {"dp": {"muslFailClosed": {"enabled": True}}}))
    loader_env = {e["name"]: e.get("value")
                  for c in loader_ds["spec"]["template"]["spec"]["containers"]
                  for e in c.get("env") or []}
    check(loader_env.get("AMDGPU_DP_LOADER_CHECK") == "true",
          "dp.muslFailClosed.enabled=true turns the plugin's loader check on",
          repr(loader_env.get("AMDGPU_DP_LOADER_CHECK")))
    try:
        render(chart, {"nodeInstaller": {"enabled": True}, "runAsUser": 1000})
        bad("nodeInstaller renders with runAsUser 1000 (its package makes 60700)")
    except helm.HelmRenderError as err:
        check("60700" in str(err), "nodeInstaller refuses runAsUser other than 60700", str(err))
    try:
        render(chart, {"dp": {"probes": {"port": 9394}}})
        bad("the probes render on the metrics port")
    except helm.HelmRenderError as err:
        check("port of their own" in str(err),
              "the chart refuses the probe port equal to the metrics port", str(err))
    monitor_check.self_tests(check, chart, render, lambda v: rejects(chart, v), ok)
    try:
        render(chart, {"podLabels": {"app.kubernetes.io/name": "x"}})
        bad("podLabels may override the selector labels")
    except helm.HelmRenderError:
        ok("podLabels may not override the chart's labels")

    template = ds["spec"]["template"]
    for label, control, mutate in BAD_OVERRIDES:
        unexpected = pss_verdict(mutate(template), exceptions)[1]
        hits = [v for v in unexpected if v.control == control]
        check(bool(hits), f"PSS check rejects {label} ({control})",
              f"found only {unexpected}")
        if hits:
            print(f"        -> {hits[0]}")

    volumes_only = [e for e in exceptions if not e.startswith("initContainer:")]
    stale = pss_verdict(template, volumes_only + ["no-such-volume"])[2]
    check(stale == ["no-such-volume"], "an exception naming no hostPath volume is reported stale")
    shrunk = copy.deepcopy(template)
    shrunk["spec"]["volumes"] = [v for v in shrunk["spec"]["volumes"] if v["name"] != "vgpu-hook"]
    stale = pss_verdict(shrunk, volumes_only)[2]
    check(stale == ["vgpu-hook"], "an exception whose volume was removed is reported stale")
    unhooked = plugin_ds(render(chart, {"dp": {"hookInstaller": {"enabled": False}}}))
    stale = pss_verdict(unhooked["spec"]["template"], exceptions)[2]
    check(stale == ["initContainer:hook-installer"],
          "an initContainer: entry without that init container is reported stale", str(stale))
    unexpected = pss_verdict(template, [e for e in exceptions if e != "dbus"])[1]
    check(any(v.volume == "dbus" for v in unexpected),
          "a hostPath volume missing from the exceptions fails the check")

    # The hook installer's exception (the installer is on by default): it
    # covers root in that init container only.
    hooked = template
    check(not pss_verdict(hooked, exceptions)[1],
          "dp.hookInstaller's init container passes with its pss-exceptions.txt entry")
    unexpected = pss_verdict(hooked, [e for e in exceptions if not e.startswith("initContainer:")])[1]
    check({v.control for v in unexpected} == INIT_CONTAINER_ALLOWED,
          "without the entry, its root UID fails the check", str(unexpected))
    unexpected = pss_verdict(deep_merge(hooked, {"spec": {"initContainers": [
        {"securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}]}}), exceptions)[1]
    check(any(v.control == "baseline/capabilities" for v in unexpected),
          "the entry does not cover a capability added to the init container")
    unexpected = pss_verdict(deep_merge(template, {"spec": {"containers": [
        {"securityContext": {"runAsUser": 0, "runAsNonRoot": False}}]}}), exceptions)[1]
    check(any(v.control == "restricted/runAsUser" for v in unexpected),
          "the entry does not let the plugin container run as root")
    try:
        render(chart, {"dp": {"hookInstaller": {"enabled": True}, "image": {"repository": ""}}})
        bad("dp.hookInstaller renders without an image")
    except (helm.HelmValuesError, helm.HelmRenderError):
        ok("dp.hookInstaller refuses to render without an image")


def check_dashboard_configmap(objects: list[dict[str, Any]], values: dict[str, Any]) -> None:
    dash = values["dashboard"]
    maps = [o for o in objects if o["kind"] == "ConfigMap"]
    if not dash["enabled"]:
        check(not maps, "dashboard off: no ConfigMap")
        return
    if not check(len(maps) == 1, "dashboard on: one ConfigMap"):
        return
    cm = maps[0]
    labels = cm["metadata"].get("labels", {})
    check(all(labels.get(k) == v for k, v in dash["labels"].items())
          and labels.get("grafana_dashboard") == "1",
          "dashboard ConfigMap carries the grafana_dashboard label")
    check(cm["metadata"].get("namespace") == (dash["namespace"] or NAMESPACE),
          "dashboard ConfigMap is in dashboard.namespace (else the release's)")
    data = cm.get("data", {}).get("amd-gpu.json", "")
    check(json.loads(data) == json.loads(dashboard_check.DASHBOARD.read_text()),
          "dashboard ConfigMap holds dashboards/amd-gpu.json")


def main() -> int:
    print(f"helm-python-sdk {helm.__version__} (Helm SDK {helm.helm_sdk_version()}), "
          f"kubernetes-validate {kubernetes_validate.__version__}")
    print(f"chart {CHART.relative_to(ROOT)}, release {RELEASE} in {NAMESPACE}, "
          f"Kubernetes schemas {', '.join(KUBE_VERSIONS)}")
    exceptions = read_exceptions()
    print(f"pss-exceptions.txt: {', '.join(exceptions)}")
    with helm.Chart.load(CHART) as chart:
        check(chart.metadata.get("apiVersion") == "v2" and chart.version == "0.1.0",
              "Chart.yaml: apiVersion v2, version 0.1.0")
        ds = check_value_set(chart, "defaults", None, exceptions)
        for path in sorted((CHART / "ci").glob("*-values.yaml")):
            overrides = yaml.safe_load(path.read_text())
            name = path.relative_to(CHART)
            check_value_set(chart, str(name), overrides, exceptions)
            if path.name.startswith("go-"):
                go_values_check.check(chart, str(name), overrides, check)
        check_value_set(chart, "the seed's spellings", SEED_SPELLINGS, exceptions)
        check_value_set(chart, "the admission policy's writers", POLICY_WRITERS, exceptions)
        dashboard_check.check_dashboard(check)
        if ds is not None:
            self_tests(chart, ds, exceptions)
        else:
            bad("self-tests skipped: the default render failed")
    print(f"\nchart-check: {len(PASSED)} passed, {len(FAILED)} failed")
    for f in FAILED:
        print(f"  failed: {f}")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())

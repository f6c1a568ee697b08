"""What HAMi's Go chart's values give through this chart (issue 37), for
.ci/chart_check.py, beyond the checks every value set gets there.

The inputs are helm/amd-gpu/ci/go-*-values.yaml: the Go chart's
(Project-HAMi/amd-device-plugin, helm/amd-gpu) default values file and its
documented uses, written from its values.yaml and README.md. Rendered
unchanged, each must give the Go result where the key means the same here,
and say in NOTES.txt what it ignores where it cannot:
  - the hook delivered where the Go chart put it, <dp.hostHookPath>/vgpu/
    libamvgpu.so, by the hook-installer init container from dp.image (the Go
    plugin's image, which bundles it at /opt/hami/lib/amd/libamvgpu.so), and
    the plugin told that directory (AMDGPU_DP_HOOK_PATH);
  - the plugin's own image (image:), unprivileged whatever
    dp.securityContext says, with a NOTES line saying it is ignored;
  - dp.excludeGPUs, dp.reportNodeCapacity, dp.logVerbosity in the plugin's
    environment (and nodes/status in the RBAC for the capacity);
  - node_selector on the pods only with node_selector_enabled;
  - dp.serviceAccount: the account created or the existing one used;
  - imagePullSecrets and tolerations as given;
  - the musl check's containerd keys and a dp.cdi.specDir amd-gpud does not
    write to, each with its NOTES line.
"""

from __future__ import annotations

from typing import Any, Callable

import helm_python as helm
import yaml

RELEASE = "amd-gpu"
NAMESPACE = "kube-system"
# Where the Go plugin's Dockerfile puts the hook in its image
# (Project-HAMi/amd-device-plugin:Dockerfile).
GO_IMAGE_HOOK = "/opt/hami/lib/amd/libamvgpu.so"
# The tag this chart names when dp.image.tag is empty (the Go plugin's v0.0.1).
GO_DEFAULT_TAG = "0.0.1"

Check = Callable[..., bool]


def _render(chart: helm.Chart, values: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    objects, notes = [], ""
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        objects.extend(d for d in yaml.safe_load_all(text) if d)
    return objects, notes


def _env(container: dict[str, Any]) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in container.get("env") or []}


def check(chart: helm.Chart, label: str, values: dict[str, Any], ok: Check) -> None:
    """The Go result of `values` (a Go chart values file) through this chart."""
    print(f"\n== HAMi's Go chart's values: {label}")
    objects, notes = _render(chart, values)
    daemonsets = [o for o in objects if o["kind"] == "DaemonSet"
                  and o["metadata"]["labels"].get("app.kubernetes.io/component") == "device-plugin"]
    if not ok(len(daemonsets) == 1, "one plugin DaemonSet"):
        return
    spec = daemonsets[0]["spec"]["template"]["spec"]
    plugin = spec["containers"][0]
    env = _env(plugin)
    dp = values["dp"]
    _check_hook(dp, spec, env, ok)

    # The plugin: this project's image, never privileged.
    sc = plugin.get("securityContext") or {}
    ok(not plugin["image"].startswith(dp["image"]["repository"] + ":"),
       "the plugin runs this project's image, not dp.image", plugin["image"])
    ok(sc.get("privileged") is False and sc.get("runAsNonRoot") is True
       and sc.get("capabilities", {}).get("drop") == ["ALL"] and not sc.get("capabilities", {}).get("add"),
       "dp.securityContext (privileged: true) leaves the plugin unprivileged", str(sc))
    ok(("dp.securityContext is ignored" in notes) == bool(dp.get("securityContext")),
       "NOTES says dp.securityContext is ignored when it is set")

    # The plugin's settings.
    excluded = dp.get("excludeGPUs") or []
    ok(env.get("AMDGPU_DP_EXCLUDE_GPUS") == (",".join(excluded) if excluded else None),
       f"dp.excludeGPUs {excluded} -> AMDGPU_DP_EXCLUDE_GPUS", str(env.get("AMDGPU_DP_EXCLUDE_GPUS")))
    capacity = bool(dp.get("reportNodeCapacity"))
    ok(env.get("AMDGPU_DP_REPORT_NODE_CAPACITY") == str(capacity).lower(),
       f"dp.reportNodeCapacity {capacity} -> AMDGPU_DP_REPORT_NODE_CAPACITY")
    role = next(o for o in objects if o["kind"] == "ClusterRole")
    ok(any("nodes/status" in r["resources"] for r in role["rules"]) == capacity,
       "patch on nodes/status exactly when dp.reportNodeCapacity")
    verbosity = dp.get("logVerbosity", 2)
    want_log = "info,plugin=trace" if verbosity >= 5 else "info,plugin=debug" if verbosity >= 3 else "info"
    ok(env.get("AMDGPU_DP_LOG") == want_log,
       f"dp.logVerbosity {verbosity} -> AMDGPU_DP_LOG={want_log}", str(env.get("AMDGPU_DP_LOG")))
    _check_pod(values, objects, spec, ok)
    _check_notes(dp, notes, ok)


def _check_hook(dp: dict[str, Any], spec: dict[str, Any], env: dict[str, str | None],
                ok: Check) -> None:
    """The hook at the Go chart's place, from the Go image, where the plugin looks."""
    hook_dir = dp["hostHookPath"].rstrip("/") + "/vgpu"
    ok(env.get("AMDGPU_DP_HOOK_PATH") == hook_dir,
       f"dp.hostHookPath {dp['hostHookPath']!r} (a prefix) -> AMDGPU_DP_HOOK_PATH={hook_dir}",
       str(env.get("AMDGPU_DP_HOOK_PATH")))
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    ok(volumes.get("vgpu-hook", {}).get("hostPath", {}).get("path") == hook_dir,
       f"the hook's hostPath volume is {hook_dir}")
    inits = spec.get("initContainers") or []
    if not dp["hookInstaller"]["enabled"]:
        ok(not inits, "dp.hookInstaller.enabled false: no hook installer")
        return
    if not ok(len(inits) == 1 and inits[0]["name"] == "hook-installer",
              "dp.hookInstaller.enabled: the hook-installer init container", str(inits)):
        return
    init = inits[0]
    image = dp["image"]
    want_image = f"{image['repository']}:{image['tag'] or GO_DEFAULT_TAG}"
    ok(init["image"] == want_image and init.get("imagePullPolicy") == image["pullPolicy"],
       f"it runs dp.image ({want_image}, {image['pullPolicy']})", init["image"])
    ok(init["command"][-2:] == [GO_IMAGE_HOOK, f"{hook_dir}/libamvgpu.so"],
       f"it copies {GO_IMAGE_HOOK} to {hook_dir}/libamvgpu.so", str(init["command"]))


def _check_pod(values: dict[str, Any], objects: list[dict[str, Any]], spec: dict[str, Any],
               ok: Check) -> None:
    want_selector = dict(values.get("node_selector") or {}) if values.get("node_selector_enabled") else {}
    selector = spec.get("nodeSelector") or {}
    ok(all(selector.get(k) == v for k, v in want_selector.items())
       and (values.get("node_selector_enabled")
            or not set(selector) & set(values.get("node_selector") or {})),
       f"node_selector_enabled {bool(values.get('node_selector_enabled'))}: "
       f"the pods select {want_selector or 'no GPU label'}", str(selector))
    ok(spec.get("tolerations") == values["tolerations"], "tolerations as given")
    ok(spec.get("imagePullSecrets", []) == values["imagePullSecrets"], "imagePullSecrets as given")
    account = values["dp"]["serviceAccount"]
    name = account["name"] or RELEASE
    accounts = [o for o in objects if o["kind"] == "ServiceAccount"]
    binding = next(o for o in objects if o["kind"] == "ClusterRoleBinding")
    ok(spec.get("serviceAccountName") == name and binding["subjects"][0]["name"] == name
       and len(accounts) == (1 if account["create"] else 0),
       f"dp.serviceAccount create {account['create']}: the pod and the RBAC use {name}")


def _check_notes(dp: dict[str, Any], notes: str, ok: Check) -> None:
    musl = dp.get("muslFailClosed") or {}
    containerd = any(musl.get(k) for k in ("ctrPath", "containerdSocketDir", "containerdSocket",
                                           "containerdDataDir"))
    ok(("containerdDataDir\nare ignored" in notes) == containerd,
       "NOTES says the musl check's containerd keys are ignored when set")
    spec_dir = (dp.get("cdi") or {}).get("specDir", "/var/run/cdi").rstrip("/")
    foreign = spec_dir not in ("/var/run/cdi", "/run/cdi", "/etc/cdi")
    ok((f"dp.cdi.specDir {dp['cdi']['specDir']} has no effect" in notes) == foreign,
       f"dp.cdi.specDir {spec_dir}: a NOTES line exactly when amd-gpud does not write there")

"""The chart's monitoring objects (HAMi's monitor contract), checked by
.ci/chart_check.py for every value set:

1. the metrics address: monitor.metricsBindAddress (":<port>" binds every
   address of the pod, 9394 by default, HAMi's vGPU monitor port), or
   0.0.0.0:<dp.metrics.port> when that is set;
2. with monitor.enabled, Service <release>-monitor selecting exactly the
   plugin's pods, its port named monitorport (as HAMi's chart names its
   monitor Service's port: Project-HAMi/HAMi
   charts/hami/templates/device-plugin/monitorservice.yaml) on
   monitor.service.port, targeting the container port "metrics"; the pods'
   prometheus.io/scrape, port and path annotations (as the Go chart's monitor
   pods carry them); a ServiceMonitor only with serviceMonitor.enabled, for
   that Service's port, with honorLabels; without monitor.enabled none of
   them;
3. the NetworkPolicy admits networkPolicy.metricsFrom to the metrics port
   only while monitor.enabled; by default that is Prometheus in namespace
   "monitoring".
Self-tests: the schema refuses bad addresses and Service types; the Go
chart's monitor keys (monitor off) render no Service and admit no scraper.
"""

from __future__ import annotations

from typing import Any, Callable

Check = Callable[..., bool]

SERVICE_MONITOR_API = "monitoring.coreos.com/v1"
HAMI_MONITOR_PORT = 9394
DEFAULT_SCRAPERS = [{
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}]

BAD_VALUES = [
    {"monitor": {"metricsBindAddress": "9394"}},
    {"monitor": {"metricsBindAddress": ":80"}},
    {"monitor": {"metricsBindAddress": "localhost:9394"}},
    {"monitor": {"enabled": "yes"}},
    {"monitor": {"bogus": 1}},
    {"monitor": {"service": {"type": "LoadBalancer"}}},
    {"monitor": {"service": {"port": "9394"}}},
    {"monitor": {"serviceMonitor": {"interval": "30 seconds"}}},
    {"dp": {"metrics": {"port": 80}}},
]


def metrics_address(values: dict[str, Any]) -> str:
    port = (values["dp"].get("metrics") or {}).get("port")
    if port:
        return f"0.0.0.0:{port}"
    bind = values["monitor"]["metricsBindAddress"]
    return f"0.0.0.0{bind}" if bind.startswith(":") else bind


def metrics_port(values: dict[str, Any]) -> int:
    return int(metrics_address(values).rsplit(":", 1)[1])


def skip_schema(obj: dict[str, Any]) -> bool:
    """The ServiceMonitor has no schema among Kubernetes' own (a CRD's):
    check_monitor checks it instead."""
    return obj.get("apiVersion") == SERVICE_MONITOR_API


def expected_counts(values: dict[str, Any]) -> dict[str, int]:
    monitor = values["monitor"]
    return {"Service": 1 if monitor["enabled"] else 0,
            "ServiceMonitor": 1 if monitor["enabled"] and monitor["serviceMonitor"]["enabled"]
            else 0}


def want_ingress(values: dict[str, Any]) -> list[dict[str, Any]]:
    sources = values["networkPolicy"]["metricsFrom"]
    if not (values["monitor"]["enabled"] and sources):
        return []
    return [{"from": sources, "ports": [{"protocol": "TCP", "port": metrics_port(values)}]}]


def check_monitor(check: Check, objects: list[dict[str, Any]], values: dict[str, Any],
                  ds: dict[str, Any], release: str, namespace: str) -> None:
    monitor = values["monitor"]
    port = metrics_port(values)
    pods = ds["spec"]["selector"]["matchLabels"]
    annotations = ds["spec"]["template"]["metadata"].get("annotations") or {}
    scrape = {k: v for k, v in annotations.items() if k.startswith("prometheus.io/")}
    services = [o for o in objects if o["kind"] == "Service"]
    monitors = [o for o in objects if o["kind"] == "ServiceMonitor"]
    if not monitor["enabled"]:
        own = {k: v for k, v in (values.get("podAnnotations") or {}).items()
               if k.startswith("prometheus.io/")}
        check(not services and not monitors and scrape == own,
              "monitor.enabled false: no Service, no ServiceMonitor, no scrape annotations",
              f"{len(services)} Services, {len(monitors)} ServiceMonitors, {scrape}")
        return
    want_scrape = {"prometheus.io/scrape": "true", "prometheus.io/port": str(port),
                   "prometheus.io/path": "/metrics"}
    want_scrape.update({k: v for k, v in (values.get("podAnnotations") or {}).items()
                        if k.startswith("prometheus.io/")})
    check(scrape == want_scrape, f"the pods say where to scrape them (prometheus.io/port {port})",
          str(scrape))
    service = services[0]
    svc = monitor["service"]
    want_port = {"name": "monitorport", "port": svc["port"], "targetPort": "metrics",
                 "protocol": "TCP"}
    if svc["type"] == "NodePort" and svc.get("nodePort"):
        want_port["nodePort"] = svc["nodePort"]
    check(service["metadata"]["name"] == f"{release}-monitor"
          and service["metadata"]["namespace"] == namespace
          and service["spec"]["selector"] == pods
          and service["spec"]["type"] == svc["type"]
          and service["spec"]["ports"] == [want_port],
          f"Service {release}-monitor: port monitorport {svc['port']} to the pods' metrics port, "
          "selecting exactly the plugin's pods", str(service))
    container = ds["spec"]["template"]["spec"]["containers"][0]
    named = [p for p in container.get("ports") or [] if p.get("name") == "metrics"]
    check([p.get("containerPort") for p in named] == [port],
          f"the Service's target, container port metrics, is the metrics port {port}", str(named))
    for key, value in (svc.get("labels") or {}).items():
        check(service["metadata"]["labels"].get(key) == value
              or key.startswith("app.kubernetes.io/") or key == "helm.sh/chart",
              f"monitor.service.labels {key} is on the Service")
    if not monitor["serviceMonitor"]["enabled"]:
        check(not monitors, "no ServiceMonitor unless monitor.serviceMonitor.enabled")
        return
    sm_values = monitor["serviceMonitor"]
    sm = monitors[0]
    endpoint = {"port": "monitorport", "path": "/metrics", "honorLabels": sm_values["honorLabels"]}
    for key in ("interval", "scrapeTimeout"):
        if sm_values.get(key):
            endpoint[key] = sm_values[key]
    check(sm["apiVersion"] == SERVICE_MONITOR_API
          and sm["metadata"]["namespace"] == (sm_values["namespace"] or namespace)
          and all(sm["metadata"]["labels"].get(k) == v for k, v in sm_values["labels"].items())
          and sm["spec"]["namespaceSelector"] == {"matchNames": [namespace]}
          and sm["spec"]["selector"] == {"matchLabels": pods}
          and all(service["metadata"]["labels"].get(k) == v for k, v in pods.items())
          and sm["spec"]["endpoints"] == [endpoint],
          "ServiceMonitor selects the monitor Service and scrapes monitorport /metrics",
          str(sm))


def self_tests(check: Check, chart: Any, render: Callable[..., list[dict[str, Any]]],
               reject: Callable[[dict[str, Any]], bool], ok: Callable[[str], None]) -> None:
    for values in BAD_VALUES:
        check(reject(values), f"schema rejects {values}")
    defaults = chart.merge_values(None)
    check(metrics_address(defaults) == f"0.0.0.0:{HAMI_MONITOR_PORT}",
          f"the metrics listen on HAMi's monitor port {HAMI_MONITOR_PORT} by default",
          metrics_address(defaults))
    check(defaults["networkPolicy"]["metricsFrom"] == DEFAULT_SCRAPERS,
          "by default the NetworkPolicy admits Prometheus in namespace monitoring",
          str(defaults["networkPolicy"]["metricsFrom"]))
    # The Go chart's monitor keys, monitor off: nothing exposed.
    off = render(chart, {"monitor": {"enabled": False, "metricsBindAddress": ":9394",
                                     "resources": {}}})
    policy = [o for o in off if o["kind"] == "NetworkPolicy"][0]["spec"]
    check(not any(o["kind"] in ("Service", "ServiceMonitor") for o in off)
          and policy["ingress"] == [],
          "the Go chart's monitor.enabled false: no Service and no scraper admitted", str(policy))
    # dp.metrics.port wins over monitor.metricsBindAddress.
    both = chart.merge_values({"dp": {"metrics": {"port": 9500}},
                               "monitor": {"metricsBindAddress": ":9600"}})
    check(metrics_port(both) == 9500, "dp.metrics.port wins over monitor.metricsBindAddress")
    try:
        render(chart, {"monitor": {"metricsBindAddress": ":9401"}})
        check(False, "the probes render on the metrics port from monitor.metricsBindAddress")
    except Exception as err:  # noqa: BLE001 - helm's render error
        check("port of their own" in str(err),
              "the chart refuses monitor.metricsBindAddress on the probe port", str(err))
    ok("monitor self-tests ran")

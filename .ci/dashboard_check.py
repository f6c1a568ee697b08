"""The Grafana dashboard of the amd-gpu chart (helm/amd-gpu/dashboards/amd-gpu.json),
checked by .ci/chart_check.py.

1. Against Grafana's dashboard schema, as Grafana's foundation SDK
   (grafana-foundation-sdk on PyPI, generated from Grafana's schemas) models it:
   the JSON is decoded into the SDK's typed Dashboard (with each panel's
   options and field config decoded by its panel plugin's model, each query by
   the Prometheus data-query model) and encoded again; every key and value
   must come back (a key the schema does not know is dropped by the decoder,
   so it fails), every panel type must be one the SDK has a model for, and
   every panel and query must name the Prometheus data source variable.
2. Every query (panel targets and query variables) names only series the
   plugin exports: plugin/src/metrics/series.txt, which a plugin unit test
   (metrics::hami::tests::the_series_list_is_in_sync) keeps equal to what
   /metrics shows.
3. The panels the issue asks for are there: CU occupancy by pod, VRAM used
   against granted per pod, health history.
Self-tests prove the checks bite: an unknown key, an unknown panel type, and a
query naming a series nobody exports must each fail.
"""

from __future__ import annotations

import copy
import json
import pathlib
import re
from typing import Any, Callable

from grafana_foundation_sdk.cog import runtime as cogruntime
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models.dashboard import Dashboard

ROOT = pathlib.Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "helm" / "amd-gpu" / "dashboards" / "amd-gpu.json"
SERIES = ROOT / "plugin" / "src" / "metrics" / "series.txt"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# PromQL words that are not series: functions, aggregations, modifiers.
PROMQL_WORDS = {
    "sum", "max", "min", "avg", "count", "by", "without", "on", "ignoring",
    "group_left", "group_right", "rate", "irate", "increase", "label_values",
    "label_replace", "topk", "bottomk", "and", "or", "unless", "offset",
    "clamp_max", "clamp_min", "max_over_time", "avg_over_time", "changes",
}

register_default_plugins()


def exported() -> set[str]:
    """Sample names /metrics shows, from series.txt (`name type` lines)."""
    names = set()
    for line in SERIES.read_text().splitlines():
        name, kind = line.split()
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}
        for suffix in suffixes.get(kind, [""]):
            names.add(name + suffix)
    return names


def series_in(expr: str) -> set[str]:
    """The series a PromQL expression names: identifiers outside label
    matchers, `by (...)`/`on (...)` lists and strings, that are not PromQL words."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "{}", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"label_values\(([^,()]*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)", r"label_values(\1)", text)
    words = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", text))
    return {w for w in words if w not in PROMQL_WORDS and not w.isdigit()}


def queries(d: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for p in d.get("panels", []):
        for t in p.get("targets", []):
            out.append((f"panel {p.get('title')!r} {t.get('refId')}", t.get("expr", "")))
    for v in d.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            q = v.get("query")
            out.append((f"variable {v.get('name')}", q.get("query", "") if isinstance(q, dict) else q))
    return out


def dropped(a: Any, b: Any, path: str = "") -> list[str]:
    """What of `a` is missing or different in `b` (keys `b` adds are defaults)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [p for k in a for p in (
            [f"{path}.{k} (not in the schema)"] if k not in b else dropped(a[k], b[k], f"{path}.{k}"))]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items, {len(b)} after decoding"]
        return [p for i, (x, y) in enumerate(zip(a, b)) for p in dropped(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} decodes as {b!r}"]


def problems(d: dict[str, Any], names: set[str]) -> list[str]:
    found = []
    try:
        model = Dashboard.from_json(d)
        again = json.loads(json.dumps(model, cls=JSONEncoder))
        found += dropped(d, again)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        return [f"the SDK cannot decode it: {err!r}"]
    for p in d.get("panels", []):
        if cogruntime.panelcfg_config(p.get("type", "")) is None:
            found.append(f"panel {p.get('title')!r}: no panel plugin {p.get('type')!r}")
        if p.get("datasource") != DATASOURCE:
            found.append(f"panel {p.get('title')!r}: data source is not ${{datasource}}")
        for t in p.get("targets", []):
            if t.get("datasource") != DATASOURCE:
                found.append(f"panel {p.get('title')!r} {t.get('refId')}: data source")
    for where, expr in queries(d):
        named = series_in(expr)
        if not named:
            found.append(f"{where}: names no series: {expr!r}")
        for name in sorted(named - names):
            found.append(f"{where}: {name} is not exported by the plugin")
    return found


def check_dashboard(check: Callable[..., bool]) -> dict[str, Any]:
    d = json.loads(DASHBOARD.read_text())
    names = exported()
    found = problems(d, names)
    check(not found, "dashboard: Grafana's dashboard schema (foundation SDK), "
          "data source, and every query names an exported series", "; ".join(found))
    exprs = " ".join(e for _, e in queries(d))
    for series, panel in [("amdgpu_dp_container_compute_units", "CU occupancy by pod"),
                          ("hami_vgpu_memory_used_bytes", "VRAM used per pod"),
                          ("hami_vgpu_memory_limit_bytes", "VRAM granted per pod"),
                          ("amdgpu_dp_gpu_health", "health history")]:
        check(series in exprs, f"dashboard shows {panel} ({series})")
    bad_cases = {
        "an unknown key": lambda x: x["panels"][0].update({"bogus": 1}),
        "an unknown panel option": lambda x: x["panels"][0]["options"].update({"bogus": 1}),
        "an unknown panel type": lambda x: x["panels"][0].update({"type": "no-such-panel"}),
        "a series nobody exports": lambda x: x["panels"][0]["targets"][0].update(
            {"expr": "sum(hami_vgpu_core_used_percent{instance=~\"$instance\"})"}),
    }
    for what, mutate in bad_cases.items():
        broken = copy.deepcopy(d)
        mutate(broken)
        check(bool(problems(broken, names)), f"self-test: the dashboard check rejects {what}")
    return d

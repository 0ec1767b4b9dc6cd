"""A Netron attachment: per-node metrics shown in Netron's sidebar.

Netron (9.x, `source/metadata.js`) opens a second JSON file dropped onto an open model when
it carries ``"signature": "netron:attachment"``. Its ``metadata`` and ``metrics`` arrays hold
entries ``{kind, target, name, value, type}``; ``kind`` is model, graph, node, value or
tensor, and ``target`` is that object's name (for a node, its ONNX node name). Entries for
nodes Netron cannot name (ONNX nodes without a name) are simply not shown there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SIGNATURE = "netron:attachment"
_NODE_METRICS = ("macs", "flops", "bytes_read", "bytes_written", "params")


def netron_attachment(d: dict[str, Any]) -> dict[str, Any]:
    """The attachment of an analysis dict (`AnalysisResult.to_dict()`)."""
    groups = {g["id"]: g for g in d["groups"]}
    hw = next(iter(d.get("estimates", {})), None)
    metadata: list[dict[str, Any]] = []
    metrics: list[dict[str, Any]] = []
    for node in d["nodes"]:
        group = groups[node["group"]]
        metadata.append(_entry("node", node["name"], "onnxlens.group",
                               f"#{group['id']} {group['pattern']}"))
        for key in _NODE_METRICS:
            if node.get(key) is not None:
                metrics.append(_entry("node", node["name"], key, node[key]))
        est = ((group.get("estimates") or {}).get(hw) or {}) if hw else {}
        if est and group["nodes"][-1] == node["name"]:  # a group's time, on its last node
            metrics.append(_entry("node", node["name"], f"group latency on {hw} (s)",
                                  est["latency_s"]))
            metrics.append(_entry("node", node["name"], "group bound", est["bound"]))
    for key in ("macs", "flops", "params", "activation_peak_bytes"):
        value = d["totals"].get(key)
        if value is not None:
            metrics.append(_entry("model", "", key, value))
    return {"signature": SIGNATURE, "metadata": metadata, "metrics": metrics}


def _entry(kind: str, target: str, name: str, value: Any) -> dict[str, Any]:
    return {"kind": kind, "target": target, "name": name, "value": value, "type": "attribute"}


def write_netron_attachment(d: dict[str, Any], path: str | Path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(netron_attachment(d), indent=1) + "\n", encoding="utf-8")
    return path

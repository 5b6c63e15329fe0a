"""docker-compose.yml's ``elastic`` profile: single-node Elasticsearch + Kibana beside OpenSearch."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_elastic_profile_services():
    text = (ROOT / "docker-compose.yml").read_text(encoding="utf-8")
    services = yaml.safe_load(text)["services"]
    elastic = {name for name, s in services.items() if "elastic" in (s.get("profiles") or [])}
    assert elastic == {"elasticsearch", "kibana-setup", "kibana"}
    es, kb = services["elasticsearch"], services["kibana"]
    env = dict(e.split("=", 1) for e in es["environment"])
    assert env["discovery.type"] == "single-node"
    assert env["xpack.security.enabled"] == "true"
    assert env["ELASTIC_PASSWORD"] == "${ELASTIC_PASSWORD:-}"  # from .env, never a literal
    assert "healthcheck" in es and "healthcheck" in kb
    assert kb["depends_on"]["kibana-setup"]["condition"] == "service_completed_successfully"
    # Host ports must not collide with the OpenSearch services.
    host_ports = [re.search(r":(\$\{[^}]+\}|\d+):", p).group(1) for s in services.values() for p in s.get("ports", [])]
    defaults = [re.sub(r"\$\{\w+:-(\d+)\}", r"\1", p) for p in host_ports]
    assert len(set(defaults)) == len(defaults), defaults
    # ${VAR:?} in the Elastic services would break `docker compose up` for OpenSearch-only users.
    for name in elastic:
        assert ":?" not in yaml.safe_dump(services[name])

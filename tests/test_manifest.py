"""manifest.yml creates the Slack app as is: it validates against Slack's manifest schema."""

import json
from pathlib import Path

import jsonschema
import yaml

ROOT = Path(__file__).parent.parent


def test_manifest_matches_slack_schema():
    schema = json.loads((ROOT / "tests" / "data" / "manifest.schema.json").read_text())
    manifest = yaml.safe_load((ROOT / "manifest.yml").read_text())
    jsonschema.validate(manifest, schema)
    assert manifest["settings"]["socket_mode_enabled"] is True
    assert [c["command"] for c in manifest["features"]["slash_commands"]] == ["/goal"]
    # `/goal admin approvers add @ana` needs ana's user id: Slack sends <@U…|ana> only when escaping.
    assert manifest["features"]["slash_commands"][0]["should_escape"] is True
    # The App Home tab: published when a person opens it.
    assert manifest["features"]["app_home"]["home_tab_enabled"] is True
    assert "app_home_opened" in manifest["settings"]["event_subscriptions"]["bot_events"]

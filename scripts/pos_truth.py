"""What scripts/compare-truth and scripts/compare-sink share: the entity
topics, the simulator's truth, the last record per key of a topic, and the
fields an entity is compared on. A module, not a command: both scripts put
this folder on their path and import it."""

import json
import os
import subprocess
import sys
import urllib.request

READ_TOPIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "read-topic")

# The simulator's entity types and posbridge's topic suffixes (EntityType::plural).
PLURAL = {
    "sale": "sales",
    "order": "orders",
    "refund": "refunds",
    "return": "returns",
    "exchange": "exchanges",
    "product": "products",
    "collection": "collections",
}


def truth_fields(entity_type):
    """The fields of an entity the truth is compared on: its state, and the
    name for the entity types whose name is in the schema."""
    return ("status", "kitchen_status", "total") + (("name",) if entity_type in ("product", "collection") else ())


def read_truth(fail, sim=None, path=None):
    """The simulator's entities, from its API (GET {sim}/sim/truth) or from a
    file holding that answer; `fail` is called when neither can be read."""
    source = path or sim.rstrip("/") + "/sim/truth"
    try:
        if path:
            with open(path) as handle:
                return json.load(handle)["entities"]
        with urllib.request.urlopen(source, timeout=10) as answer:
            return json.load(answer)["entities"]
    except Exception as error:  # any failure here means: no truth to compare with
        fail(f"cannot read {source}: {error}")


def compacted(fail, brokers, topic, timeout, registry=None):
    """The last record per key of a topic, as read-topic prints them, by key."""
    command = [sys.executable, READ_TOPIC, "--brokers", brokers, "--topic", topic, "--compacted",
               "--timeout", str(timeout)]
    if registry:
        command += ["--registry", registry]
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode != 0:
        fail(f"read-topic {topic}: {run.stderr.strip() or run.returncode}")
    records = {}
    for line in run.stdout.splitlines():
        record = json.loads(line)
        records[record["key"]] = record
    return records

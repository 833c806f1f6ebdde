"""Decodes a topic's records with Confluent's own Python client and fastavro.

Cross-checks the bytes posbridge writes, with code that is not posbridge's:
* Confluent wire format (first byte 0): AvroDeserializer reads the schema id,
  fetches the schema from the registry and decodes the datum.
* Avro single-object encoding (first bytes C3 01): the 8-byte fingerprint must
  be fastavro's CRC-64-AVRO of the schema's Parsing Canonical Form, then
  fastavro decodes the datum.
Prints one JSON object per record; exits non-zero on any mismatch.

    python decode.py BROKERS TOPIC [REGISTRY_URL]
"""

import io
import json
import pathlib
import sys
import time
import uuid

import fastavro
from confluent_kafka import Consumer, TopicPartition
from fastavro.schema import fingerprint, to_parsing_canonical_form

SCHEMA_FILE = pathlib.Path(__file__).resolve().parents[2] / "schemas" / "pos_event.avsc"


def main() -> None:
    brokers, topic = sys.argv[1:3]
    registry = sys.argv[3] if len(sys.argv) > 3 else None
    schema = fastavro.parse_schema(json.loads(SCHEMA_FILE.read_text()))
    expected = bytes.fromhex(fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))
    deserializer = None
    if registry:
        from confluent_kafka.schema_registry import SchemaRegistryClient
        from confluent_kafka.schema_registry.avro import AvroDeserializer

        # Confluent's client waits forever for an answer by default; with a
        # timeout it retries a request the registry left unanswered (seen once).
        deserializer = AvroDeserializer(SchemaRegistryClient({"url": registry, "timeout": 10}))

    consumer = Consumer({
        "bootstrap.servers": brokers,
        "group.id": f"py-{uuid.uuid4()}",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    })
    _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    consumer.assign([TopicPartition(topic, 0, 0)])
    seen = set()
    deadline = time.time() + 20
    while len(seen) < high and time.time() < deadline:
        message = consumer.poll(0.5)
        if message is None or message.error() or message.offset() in seen:
            continue
        seen.add(message.offset())
        raw = message.value()
        out = {"key": message.key().decode()}
        if raw is None:
            out["value"] = None
        elif raw[:1] == b"\x00":
            from confluent_kafka.serialization import MessageField, SerializationContext

            out["framing"] = "confluent"
            out["schema_id"] = int.from_bytes(raw[1:5], "big")
            out["value"] = deserializer(raw, SerializationContext(topic, MessageField.VALUE))
        elif raw[:2] == b"\xc3\x01":
            out["framing"] = "single-object"
            if raw[2:10] != expected:
                sys.exit(f"fingerprint {raw[2:10].hex()} is not the spec's {expected.hex()}")
            out["value"] = fastavro.schemaless_reader(io.BytesIO(raw[10:]), schema)
        else:
            sys.exit(f"unknown framing {raw[:2].hex()}")
        print(json.dumps(out, default=str), flush=True)
    consumer.close()
    if len(seen) < high:
        sys.exit(f"read {len(seen)} of {high} records")


if __name__ == "__main__":
    main()

"""Decodes a topic's records with Confluent's own Python client.

Cross-checks posbridge's Confluent wire-format bytes: AvroDeserializer reads
the schema id from the bytes, fetches the schema from the registry and decodes
the datum. Prints one JSON object per record.

    python decode_confluent.py BROKERS TOPIC REGISTRY_URL
"""

import json
import sys
import time
import uuid

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext


def main() -> None:
    brokers, topic, registry = sys.argv[1:4]
    deserializer = AvroDeserializer(SchemaRegistryClient({"url": registry}))
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
        if message is None or message.error():
            continue
        if message.offset() in seen:
            continue
        seen.add(message.offset())
        value = deserializer(message.value(), SerializationContext(topic, MessageField.VALUE))
        print(json.dumps({
            "key": message.key().decode(),
            "schema_id": int.from_bytes(message.value()[1:5], "big"),
            "value": value,
        }, default=str), flush=True)
    consumer.close()
    if len(seen) < high:
        sys.exit(f"read {len(seen)} of {high} records")


if __name__ == "__main__":
    main()

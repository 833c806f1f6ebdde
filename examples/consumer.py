#!/usr/bin/env python3
"""A downstream consumer of posbridge's topics, to copy: reads every record of
an entity topic in either framing posbridge writes, keeps the latest state per
key (the compacted view: a tombstone removes the key), and prints one JSON
line per entity. Needs confluent-kafka[avro,schemaregistry] only.

    python3 examples/consumer.py --brokers 127.0.0.1:9092 --topic pos.orders \\
        [--registry http://127.0.0.1:8081] [--schemas schemas]

* Single-object encoding (C3 01, 8-byte fingerprint, datum): the writer schema
  is found by its fingerprint among the .avsc files of --schemas and its
  history/ folder, so records of every released version are read.
* Confluent wire format (00, 4-byte schema id, datum): Confluent's
  AvroDeserializer fetches the writer schema from --registry.

A real service would commit offsets with a consumer group; this reads from
the beginning to the end once.
"""

import argparse
import decimal
import glob
import io
import json
import os

import fastavro
from confluent_kafka import Consumer, TopicPartition
from fastavro.schema import fingerprint, to_parsing_canonical_form

FIELDS = ("entity_type", "entity_id", "status", "total", "name", "version_at")


def single_object_schemas(folder):
    """Writer schemas by their single-object fingerprint (the header's bytes)."""
    schemas = {}
    for path in glob.glob(os.path.join(folder, "*.avsc")) + glob.glob(
        os.path.join(folder, "history", "*.avsc")
    ):
        with open(path, encoding="utf-8") as f:
            schema = json.load(f)
        key = bytes.fromhex(fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))
        schemas[key] = fastavro.parse_schema(schema)
    return schemas


def plain(value):
    """JSON-ready: decimals with their 4 places, times as microseconds."""
    if isinstance(value, decimal.Decimal):
        return f"{value:.4f}"
    if hasattr(value, "timestamp"):
        return round(value.timestamp() * 1_000_000)
    return value


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--brokers", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--registry")
    parser.add_argument("--schemas", default="schemas")
    args = parser.parse_args()

    by_fingerprint = single_object_schemas(args.schemas)
    confluent = None
    if args.registry:
        from confluent_kafka.schema_registry import SchemaRegistryClient
        from confluent_kafka.schema_registry.avro import AvroDeserializer
        from confluent_kafka.serialization import MessageField, SerializationContext

        # Confluent's client waits forever for an answer by default; with a
        # timeout it retries a request the registry left unanswered (seen once).
        deserializer = AvroDeserializer(SchemaRegistryClient({"url": args.registry, "timeout": 10}))
        context = SerializationContext(args.topic, MessageField.VALUE)
        confluent = lambda value: deserializer(value, context)  # noqa: E731

    def decode(value):
        if value[:2] == b"\xc3\x01" and value[2:10] in by_fingerprint:
            return fastavro.schemaless_reader(io.BytesIO(value[10:]), by_fingerprint[value[2:10]])
        if value[:1] == b"\x00" and confluent is not None:
            return confluent(value)
        raise SystemExit("not a posbridge record of a known version (dead letters are raw JSON)")

    consumer = Consumer(
        {"bootstrap.servers": args.brokers, "group.id": "posbridge-example-consumer",
         "enable.auto.commit": False}
    )
    metadata = consumer.list_topics(args.topic, timeout=10)
    latest = {}
    for partition in metadata.topics[args.topic].partitions:
        _, high = consumer.get_watermark_offsets(TopicPartition(args.topic, partition), timeout=10)
        if high == 0:
            continue
        consumer.assign([TopicPartition(args.topic, partition, 0)])
        next_offset = 0
        while next_offset < high:
            message = consumer.poll(10)
            if message is None:
                raise SystemExit(f"{args.topic}/{partition}: nothing after offset {next_offset}")
            if message.error():
                raise SystemExit(str(message.error()))
            next_offset = message.offset() + 1
            key = message.key().decode()
            if message.value() is None:
                latest.pop(key, None)
                continue
            record = decode(message.value())
            latest[key] = {"key": key, **{f: plain(record.get(f)) for f in FIELDS}}
    consumer.close()
    for key in sorted(latest):
        print(json.dumps(latest[key]))


if __name__ == "__main__":
    main()

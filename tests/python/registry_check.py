"""Asks a Schema Registry, with Confluent's own Python client, what
`posbridge schema check` asks: whether a schema is registered under a subject,
and whether the subject's rules accept it as the next version.

    registry_check.py URL SUBJECT SCHEMA_FILE

Prints {"registered": bool, "compatible": bool | null}; null for a subject
that does not exist.
"""

import json
import sys

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError


def main():
    url, subject, path = sys.argv[1:4]
    client = SchemaRegistryClient({"url": url, "timeout": 10})
    schema = Schema(open(path).read(), "AVRO")
    try:
        client.lookup_schema(subject, schema)
        registered = True
    except SchemaRegistryError as error:
        if error.http_status_code != 404:
            raise
        registered = False
    # Whether the subject exists is asked first: Confluent's registry answers
    # the compatibility check of an unknown subject with 404, Apicurio's
    # Confluent-compatible API with "compatible".
    try:
        client.get_versions(subject)
        compatible = client.test_compatibility(subject, schema)
    except SchemaRegistryError as error:
        if error.http_status_code != 404:
            raise
        compatible = None
    print(json.dumps({"registered": registered, "compatible": compatible}))


if __name__ == "__main__":
    main()

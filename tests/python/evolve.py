"""Reads one Avro single-object message written with one schema version,
using another version as the reader schema, with fastavro (the library under
Confluent's Python client): the cross-check of posbridge's schema evolution.

    evolve.py WRITER.avsc READER.avsc HEX

HEX is the whole message (C3 01, 8-byte fingerprint, datum). Prints the
record as JSON (decimals and times as strings).
"""

import io
import json
import sys

from fastavro import parse_schema, schemaless_reader


def main():
    writer = parse_schema(json.load(open(sys.argv[1])))
    reader = parse_schema(json.load(open(sys.argv[2])))
    message = bytes.fromhex(sys.argv[3])
    assert message[:2] == b"\xc3\x01", "single-object magic"
    record = schemaless_reader(io.BytesIO(message[10:]), writer, reader)
    print(json.dumps(record, default=str))


if __name__ == "__main__":
    main()

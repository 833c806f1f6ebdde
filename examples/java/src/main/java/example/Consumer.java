package example;

import io.apicurio.registry.serde.Default4ByteIdHandler;
import io.apicurio.registry.serde.avro.AvroKafkaDeserializer;
import io.apicurio.registry.serde.avro.AvroSerdeConfig;
import io.apicurio.registry.serde.avro.DefaultAvroDatumProvider;
import io.apicurio.registry.serde.config.IdOption;
import io.apicurio.registry.serde.config.SerdeConfig;
import java.io.IOException;
import java.math.BigDecimal;
import java.math.RoundingMode;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.time.Instant;
import java.time.temporal.ChronoUnit;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.stream.Stream;
import org.apache.avro.Conversions;
import org.apache.avro.Schema;
import org.apache.avro.data.TimeConversions;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.DatumReader;
import org.apache.avro.message.BinaryMessageDecoder;
import org.apache.avro.message.MissingSchemaException;
import org.apache.avro.message.SchemaStore;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.StringDeserializer;

/**
 * A downstream consumer of posbridge's topics, to copy: reads every record of
 * an entity topic in either framing posbridge writes, keeps the latest state
 * per key (the compacted view: a tombstone removes the key), and prints one
 * JSON line per entity, as examples/consumer.py does (same fields, same
 * order, same bytes).
 *
 * <pre>
 * scripts/java-consumer --brokers 127.0.0.1:9092 --topic pos.orders \
 *     [--registry http://127.0.0.1:8081/apis/ccompat/v7] [--schemas schemas]
 * </pre>
 *
 * <ul>
 *   <li>Single-object encoding (C3 01, 8-byte fingerprint, datum): Avro's
 *       BinaryMessageDecoder finds the writer schema by its fingerprint among
 *       the .avsc files of --schemas and its history/ folder.
 *   <li>Confluent wire format (00, 4-byte schema id, datum): Apicurio
 *       Registry's Avro deserializer fetches the writer schema by that id.
 * </ul>
 *
 * A real service would commit offsets with a consumer group; this reads from
 * the beginning to the end once.
 */
public final class Consumer {

    /** Printed after "key", in this order (examples/consumer.py's FIELDS). */
    private static final List<String> FIELDS =
            List.of("entity_type", "entity_id", "status", "total", "name", "version_at");

    /**
     * One Avro data model for both framings: decimal(38,4) is read as
     * BigDecimal and timestamp-micros as Instant, not as bytes and long.
     */
    static final GenericData MODEL = new GenericData();

    static {
        MODEL.addLogicalTypeConversion(new Conversions.DecimalConversion());
        MODEL.addLogicalTypeConversion(new TimeConversions.TimestampMicrosConversion());
    }

    /** Python's sorted() order for the keys: by code point, not UTF-16 unit. */
    private static final Comparator<String> CODE_POINT_ORDER =
            (a, b) -> Arrays.compare(a.codePoints().toArray(), b.codePoints().toArray());

    private static final Duration WAIT = Duration.ofSeconds(10);

    public static void main(String[] argv) throws Exception {
        try {
            run(argv);
        } catch (Failure e) {
            // As Python's SystemExit(message): the message, status 1.
            System.err.println(e.getMessage());
            System.exit(1);
        }
    }

    static void run(String[] argv) throws IOException {
        Map<String, String> args = arguments(argv);
        String brokers = required(args, "--brokers");
        String topic = required(args, "--topic");
        String registry = args.get("--registry");
        BinaryMessageDecoder<GenericRecord> singleObject =
                singleObjectDecoder(Path.of(args.getOrDefault("--schemas", "schemas")));

        Properties properties = new Properties();
        properties.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, brokers);
        properties.put(ConsumerConfig.CLIENT_ID_CONFIG, "posbridge-example-consumer");
        // No group: partitions are assigned by hand and no offset is committed.
        properties.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        // A reader: asking for a topic that does not exist must not create it.
        properties.put(ConsumerConfig.ALLOW_AUTO_CREATE_TOPICS_CONFIG, "false");

        // try-with-resources skips a null resource: no registry, no deserializer.
        try (AvroKafkaDeserializer<GenericRecord> confluent =
                        registry == null ? null : confluentDeserializer(registry);
                KafkaConsumer<String, byte[]> consumer = new KafkaConsumer<>(
                        properties, new StringDeserializer(), new ByteArrayDeserializer())) {
            List<TopicPartition> partitions = new ArrayList<>();
            for (PartitionInfo partition : consumer.partitionsFor(topic, WAIT)) {
                partitions.add(new TopicPartition(topic, partition.partition()));
            }
            if (partitions.isEmpty()) {
                throw new Failure("no topic " + topic);
            }
            // Read up to the end offsets (high watermarks) of now, and no further.
            Map<TopicPartition, Long> end = new HashMap<>(consumer.endOffsets(partitions, WAIT));
            end.values().removeIf(high -> high == 0);
            consumer.assign(end.keySet());
            consumer.seekToBeginning(end.keySet());

            Map<String, Map<String, Object>> latest = new TreeMap<>(CODE_POINT_ORDER);
            while (!end.isEmpty()) {
                ConsumerRecords<String, byte[]> records = consumer.poll(WAIT);
                if (records.isEmpty()) {
                    throw new Failure(topic + ": nothing more before the end offsets " + end);
                }
                for (ConsumerRecord<String, byte[]> record : records) {
                    Long high = end.get(new TopicPartition(record.topic(), record.partition()));
                    if (high == null || record.offset() >= high) {
                        continue; // written after we started, or a partition already done
                    }
                    String key = record.key() == null ? "" : record.key();
                    if (record.value() == null) {
                        latest.remove(key); // a tombstone: the entity is gone
                        continue;
                    }
                    GenericRecord value = decode(record, singleObject, confluent);
                    Map<String, Object> state = new LinkedHashMap<>();
                    state.put("key", key);
                    for (String field : FIELDS) {
                        // A field its writer's version lacks is null, as in Python.
                        state.put(field, value.hasField(field) ? plain(value.get(field)) : null);
                    }
                    latest.put(key, state);
                }
                // A partition is done once its position has reached its end offset
                // (compaction leaves gaps, so the last offset read may be lower).
                end.entrySet().removeIf(e -> consumer.position(e.getKey()) >= e.getValue());
            }
            for (Map<String, Object> state : latest.values()) {
                System.out.println(json(state));
            }
        }
    }

    /**
     * Single-object records: every schema of DIR/*.avsc and DIR/history/*.avsc,
     * known by its fingerprint. The current version, DIR/pos_event.avsc, is the
     * reader schema: a record of an earlier version is resolved to it, the
     * fields that version lacks read as their defaults.
     */
    static BinaryMessageDecoder<GenericRecord> singleObjectDecoder(Path dir) throws IOException {
        SchemaStore.Cache store = new SchemaStore.Cache();
        for (Path folder : List.of(dir, dir.resolve("history"))) {
            if (!Files.isDirectory(folder)) {
                continue;
            }
            try (Stream<Path> files = Files.list(folder)) {
                for (Path file : files.filter(f -> f.toString().endsWith(".avsc")).toList()) {
                    store.addSchema(parse(file));
                }
            }
        }
        Path current = dir.resolve("pos_event.avsc");
        if (!Files.isRegularFile(current)) {
            throw new Failure("--schemas " + dir + ": no pos_event.avsc there (posbridge's schemas/)");
        }
        return new BinaryMessageDecoder<>(MODEL, parse(current), store);
    }

    /** A parser per file: the versions define the same names again. */
    private static Schema parse(Path file) throws IOException {
        return new Schema.Parser().parse(file.toFile());
    }

    /**
     * Confluent-framed records, through Apicurio Registry's deserializer. That
     * serde speaks Apicurio's own REST API (v3), not the Confluent-compatible
     * one posbridge registers through (/apis/ccompat/v7): the same server
     * answers both, so the core API's URL is derived from the one given. The
     * 4-byte id ccompat hands out is Apicurio's content id (unless the server
     * runs with apicurio.ccompat.legacy-id-mode.enabled, where it is the
     * global id: then use IdOption.globalId).
     */
    static AvroKafkaDeserializer<GenericRecord> confluentDeserializer(String registry) {
        int apis = registry.indexOf("/apis/");
        String coreApi = (apis < 0 ? registry.replaceAll("/+$", "") : registry.substring(0, apis))
                + "/apis/registry/v3";
        Map<String, Object> config = new HashMap<>();
        config.put(SerdeConfig.REGISTRY_URL, coreApi);
        // Both are the defaults, spelled out: 00 + 4-byte id, looked up as a
        // content id (GET /apis/registry/v3/ids/contentIds/{id}).
        config.put(SerdeConfig.ID_HANDLER, Default4ByteIdHandler.class.getName());
        config.put(SerdeConfig.USE_ID, IdOption.contentId.name());
        // The JDK's HttpClient (kiota-http-jdk in pom.xml) rather than the
        // default Vert.x, whose shared instance it starts and warns about.
        config.put(SerdeConfig.HTTP_ADAPTER, "JDK");
        // Records read with MODEL, so both framings give the same Java types.
        config.put(AvroSerdeConfig.AVRO_DATUM_PROVIDER, ConvertingDatumProvider.class);
        AvroKafkaDeserializer<GenericRecord> deserializer = new AvroKafkaDeserializer<>();
        deserializer.configure(config, false);
        return deserializer;
    }

    /** Apicurio's datum provider, its readers using MODEL's conversions. */
    public static final class ConvertingDatumProvider extends DefaultAvroDatumProvider<GenericRecord> {
        @Override
        public DatumReader<GenericRecord> createDatumReader(Schema schema) {
            return new GenericDatumReader<>(schema, schema, MODEL);
        }
    }

    /** One record value, whichever framing it has. */
    static GenericRecord decode(
            ConsumerRecord<String, byte[]> record,
            BinaryMessageDecoder<GenericRecord> singleObject,
            AvroKafkaDeserializer<GenericRecord> confluent)
            throws IOException {
        byte[] value = record.value();
        if (value.length >= 10 && value[0] == (byte) 0xC3 && value[1] == 0x01) {
            try {
                return singleObject.decode(value);
            } catch (MissingSchemaException e) {
                throw new Failure("a single-object record of an unknown schema version: " + e.getMessage());
            }
        }
        if (value.length >= 5 && value[0] == 0 && confluent != null) {
            return confluent.deserialize(record.topic(), record.headers(), value);
        }
        throw new Failure("not a posbridge record of a known version (dead letters are raw JSON;"
                + " Confluent-framed records need --registry)");
    }

    /** JSON-ready: decimals with their 4 places, times as microseconds. */
    static Object plain(Object value) {
        if (value instanceof BigDecimal decimal) {
            return decimal.setScale(4, RoundingMode.HALF_EVEN).toPlainString();
        }
        if (value instanceof Instant instant) {
            return ChronoUnit.MICROS.between(Instant.EPOCH, instant);
        }
        if (value instanceof CharSequence || value instanceof GenericData.EnumSymbol) {
            return value.toString(); // Avro's Utf8 and enum symbols
        }
        return value; // null, numbers, booleans
    }

    /** As Python's json.dumps writes it: ", " and ": " between items, non-ASCII escaped. */
    static String json(Map<String, Object> object) {
        StringBuilder out = new StringBuilder("{");
        for (Map.Entry<String, Object> entry : object.entrySet()) {
            if (out.length() > 1) {
                out.append(", ");
            }
            string(out, entry.getKey());
            out.append(": ");
            Object value = entry.getValue();
            if (value instanceof String text) {
                string(out, text);
            } else {
                out.append(value); // null, numbers, true/false
            }
        }
        return out.append('}').toString();
    }

    private static void string(StringBuilder out, String text) {
        out.append('"');
        for (char c : text.toCharArray()) {
            switch (c) {
                case '"' -> out.append("\\\"");
                case '\\' -> out.append("\\\\");
                case '\n' -> out.append("\\n");
                case '\r' -> out.append("\\r");
                case '\t' -> out.append("\\t");
                case '\b' -> out.append("\\b");
                case '\f' -> out.append("\\f");
                default -> {
                    if (c < 0x20 || c > 0x7f) {
                        out.append(String.format("\\u%04x", (int) c));
                    } else {
                        out.append(c);
                    }
                }
            }
        }
        out.append('"');
    }

    /** --name value pairs; a later one wins (scripts/java-consumer puts --schemas first). */
    private static Map<String, String> arguments(String[] argv) {
        Map<String, String> args = new HashMap<>();
        for (int i = 0; i < argv.length; i += 2) {
            if (!List.of("--brokers", "--topic", "--registry", "--schemas").contains(argv[i])
                    || i + 1 == argv.length) {
                throw new Failure("usage: --brokers HOST:PORT --topic TOPIC [--registry URL] [--schemas DIR]"
                        + " (at " + argv[i] + ")");
            }
            args.put(argv[i], argv[i + 1]);
        }
        return args;
    }

    private static String required(Map<String, String> args, String name) {
        String value = args.get(name);
        if (value == null) {
            throw new Failure(name + " is required");
        }
        return value;
    }

    /** What ends the run with a message rather than a stack trace. */
    static final class Failure extends RuntimeException {
        Failure(String message) {
            super(message);
        }
    }
}

-- The seven tables the PostgreSQL sink (deploy/connect/pos-postgres-sink.json)
-- writes, created before the connector starts (docs/SINK.md). The Debezium
-- JDBC sink could create them itself (schema.evolution=basic), but:
--
-- * its timestamps would be `timestamp(6)` without time zone: Connect has no
--   time-zone-aware timestamp type but Debezium's string ZonedTimestamp
--   (posbridge's times arrive as Debezium MicroTimestamps, named so by the
--   schema, and an earlier version's as int64 until the connector's
--   TimestampConverter steps make them Connect Timestamps).
--   Created here, they are `timestamptz`; the sink binds UTC instants into them
--   (the worker's JVM runs in UTC, which the driver sends as the session's
--   TimeZone);
-- * a tombstone for a table that does not exist yet (a topic whose first
--   record the sink reads is a delete, as a compacted topic's oldest can
--   be) stops the task: the sink has no value schema to make the table from
--   (a NullPointerException on the null value, tried with 3.3.1.Final).
--
-- Columns follow schemas/pos_event.avsc, field by field, under the same
-- names; `key` is the record key (`{provider}:{entity_id}`). The line items
-- (`items`, `items_given`: arrays of records) are not here: the sink has no
-- column type for them (see docs/SINK.md); `raw` keeps the provider's JSON.
-- A column a later schema version adds is added by the sink itself (ALTER
-- TABLE … ADD COLUMN, nullable, schema.evolution=basic) with the type it
-- maps the field to: right for text, numeric(38,4), boolean and text[], but
-- `timestamp` without time zone for a timestamp field. Add such a column
-- here and to the live tables (timestamptz) before the posbridge that
-- writes it is deployed (docs/SINK.md, "When the schema gains a field").
--
-- The tables are pos_{entity}, the names the connector gives the topics
-- pos.{entity}; for another topic prefix (a test's own topics), set
-- posbridge.table_prefix in the session first: the connector's table for
-- topic {prefix}.sales is {prefix}_sales (collection.name.format=${topic},
-- dots as underscores).
--
--   psql -h 127.0.0.1 -p PORT -U postgres -d posbridge -f deploy/connect/tables.sql
--   psql … -c "SET posbridge.table_prefix = 't1_'" -f deploy/connect/tables.sql
DO $$
DECLARE
  entity text;
  prefix text := coalesce(nullif(current_setting('posbridge.table_prefix', true), ''), 'pos_');
BEGIN
  FOREACH entity IN ARRAY ARRAY['sales', 'orders', 'refunds', 'returns', 'exchanges', 'products', 'collections'] LOOP
    EXECUTE format($ddl$
      CREATE TABLE IF NOT EXISTS %I (
        key            text PRIMARY KEY,
        event_id       text NOT NULL,
        provider       text NOT NULL,
        source         text NOT NULL,
        account        text,
        entity_type    text NOT NULL,
        entity_id      text NOT NULL,
        event_type     text NOT NULL,
        occurred_at    timestamptz NOT NULL,
        version_at     timestamptz NOT NULL,
        version_rank   integer NOT NULL,
        received_at    timestamptz NOT NULL,
        origin         text NOT NULL,
        outlet_id      text,
        store_id       text,
        terminal_id    text,
        currency       text,
        subtotal       numeric(38,4),
        tax            numeric(38,4),
        total          numeric(38,4),
        status         text,
        kitchen_status text,
        business_at    timestamptz,
        name           text,
        sku            text,
        price          numeric(38,4),
        active         boolean,
        product_ids    text[],
        order_id       text,
        reason         text,
        payment_method text,
        customer_id    text,
        raw            text NOT NULL
      )$ddl$, prefix || entity);
  END LOOP;
END
$$;

-- +goose Up
-- Consumer partitions (ARCHITECTURE §5): a consumer may run as several
-- state rows, partition i of n reading only the events whose stream hashes
-- to i, so passes of different partitions run in parallel while each
-- stream's events still arrive in order. An unpartitioned consumer is
-- partition 0 of 1 and reads every stream.
ALTER TABLE event_consumers
    ADD COLUMN partition_index int NOT NULL DEFAULT 0,
    ADD COLUMN partition_count int NOT NULL DEFAULT 1,
    ADD CONSTRAINT event_consumers_partition_check
        CHECK (partition_count >= 1 AND partition_index >= 0 AND partition_index < partition_count);

-- kumiko_stream_partition is the partition (0 .. n-1) of a stream id among
-- n. hashtextextended is stable across PostgreSQL versions (hash indexes
-- survive pg_upgrade), so a stream keeps its partition. Simple enough for
-- the planner to inline.
-- +goose StatementBegin
CREATE FUNCTION kumiko_stream_partition(stream_id text, n int) RETURNS int
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT CASE WHEN n <= 1 THEN 0 ELSE (((hashtextextended(stream_id, 0) % n) + n) % n)::int END $$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION kumiko_stream_partition(text, int);
ALTER TABLE event_consumers
    DROP CONSTRAINT event_consumers_partition_check,
    DROP COLUMN partition_count,
    DROP COLUMN partition_index;

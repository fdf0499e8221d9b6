-- +goose Up
-- kumiko_stream_partition as 00007 created it is STRICT, and the planner
-- does not inline a STRICT SQL function whose body (a CASE) is not strict
-- itself: every pass of a partitioned consumer, and the lag, readiness and
-- retention queries, called it as a SQL function on every event they read
-- past, some twenty times the cost of the inlined expression. Without
-- STRICT it is inlined; it returns the same partition for every stream id
-- (stream_id is NOT NULL, and a NULL argument still gives NULL for n > 1).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION kumiko_stream_partition(stream_id text, n int) RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT CASE WHEN n <= 1 THEN 0 ELSE (((hashtextextended(stream_id, 0) % n) + n) % n)::int END $$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION kumiko_stream_partition(stream_id text, n int) RETURNS int
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT CASE WHEN n <= 1 THEN 0 ELSE (((hashtextextended(stream_id, 0) % n) + n) % n)::int END $$;
-- +goose StatementEnd

-- +goose Up
-- A handler runs its own SQL as kumiko_tenant, which must be able to append
-- (the append statement inserts into events and upserts streams) but must not
-- be able to write what only the append computes: the position, the commit
-- keys, the creation time and the streams head. A forged position ahead of
-- the sequence made another tenant's append fail (a duplicate key, reported
-- as a version conflict); a forged commit key below the transaction's id put
-- an event behind the consumers' cursors (never delivered), and one ahead of
-- the server's transaction ids tripped the restore check (readiness 503,
-- every tenant's writes paused); a rewound or renamed streams head made every
-- later append to that stream fail.
--
-- The position is the sequence's default; the tenant role may not name it
-- (nor created_at).
ALTER TABLE events ALTER COLUMN position SET DEFAULT nextval('kumiko_event_position_seq');
REVOKE INSERT ON events FROM kumiko_tenant;
GRANT INSERT (commit_key, tenant_id, stream_type, stream_id, version, type, type_version, payload, metadata)
    ON events TO kumiko_tenant;

-- An event's commit key is its transaction's id or a later key that some
-- transaction already holds (the stream's previous one): never below the
-- former, never in the future (pg_xact_status raises for a future id).
CREATE POLICY kumiko_commit_key ON events AS RESTRICTIVE FOR INSERT TO kumiko_tenant
    WITH CHECK (commit_key >= pg_current_xact_id() AND pg_xact_status(commit_key) IS NOT NULL);

-- A new stream's head carries exactly the transaction's id.
CREATE POLICY kumiko_commit_key ON streams AS RESTRICTIVE FOR INSERT TO kumiko_tenant
    WITH CHECK (last_commit_key = pg_current_xact_id());

-- An update of a head only moves it forward as the append does: a higher
-- version, the key GREATEST(own id, previous key), the same stream. The WHEN
-- condition keeps the append from calling the function at all.
-- +goose StatementBegin
CREATE FUNCTION kumiko_stream_head_guard() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    RAISE EXCEPTION USING
        ERRCODE = 'insufficient_privilege',
        MESSAGE = format('kumiko: stream %s/%s: its head row moves only by an append (version %s to %s, commit key %s to %s)',
                         OLD.stream_type, OLD.stream_id, OLD.version, NEW.version, OLD.last_commit_key, NEW.last_commit_key);
END
$fn$;
-- +goose StatementEnd
CREATE TRIGGER kumiko_stream_head_guard BEFORE UPDATE ON streams FOR EACH ROW
    WHEN (NEW.version <= OLD.version
          OR NEW.last_commit_key IS DISTINCT FROM GREATEST(pg_current_xact_id(), OLD.last_commit_key)
          OR NEW.tenant_id IS DISTINCT FROM OLD.tenant_id
          OR NEW.stream_type IS DISTINCT FROM OLD.stream_type
          OR NEW.stream_id IS DISTINCT FROM OLD.stream_id)
    EXECUTE FUNCTION kumiko_stream_head_guard();

-- +goose Down
DROP TRIGGER kumiko_stream_head_guard ON streams;
DROP FUNCTION kumiko_stream_head_guard();
DROP POLICY kumiko_commit_key ON streams;
DROP POLICY kumiko_commit_key ON events;
REVOKE INSERT ON events FROM kumiko_tenant;
GRANT INSERT ON events TO kumiko_tenant;
ALTER TABLE events ALTER COLUMN position DROP DEFAULT;

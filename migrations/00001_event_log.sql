-- +goose Up
-- The roles are cluster-wide; create them only when missing (several test
-- databases migrate concurrently, so a duplicate is tolerated).
-- +goose StatementBegin
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'kumiko_tenant') THEN
        CREATE ROLE kumiko_tenant NOLOGIN;
    END IF;
EXCEPTION WHEN duplicate_object OR unique_violation THEN
    NULL;
END
$$;
-- +goose StatementEnd
-- The connecting user switches to kumiko_tenant with SET LOCAL ROLE for every
-- tenant-scoped transaction; a non-superuser needs membership for that. The
-- grant fails for a user that neither owns the role nor has ADMIN on it (the
-- role was created by another owner, e.g. for a second environment on the
-- same server): that is fine only when the user can use the role already (a
-- member, or a superuser); otherwise every write would fail later, so the
-- migration stops here and says what to run.
-- +goose StatementBegin
DO $$
BEGIN
    EXECUTE format('GRANT kumiko_tenant TO %I', current_user);
EXCEPTION WHEN OTHERS THEN
    IF NOT pg_has_role(current_user, 'kumiko_tenant', 'MEMBER') THEN
        RAISE EXCEPTION 'kumiko: the database user % is not a member of the role kumiko_tenant and cannot grant it to itself (%); have the owner of kumiko_tenant or a superuser run: GRANT kumiko_tenant TO %, then run kumiko migrate again',
            current_user, SQLERRM, quote_ident(current_user)
            USING ERRCODE = 'insufficient_privilege';
    END IF;
END
$$;
-- +goose StatementEnd

-- kumiko_enable_tenancy puts a table with a tenant_id text column under
-- row-level security: the kumiko_tenant role sees and writes only rows of the
-- tenant set in kumiko.tenant_id; the owner (the framework's system path)
-- keeps full access. Feature migrations call it for every tenant table.
-- +goose StatementBegin
CREATE FUNCTION kumiko_enable_tenancy(tbl regclass) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    EXECUTE format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', tbl);
    EXECUTE format('ALTER TABLE %s FORCE ROW LEVEL SECURITY', tbl);
    EXECUTE format('CREATE POLICY kumiko_tenant_isolation ON %s TO kumiko_tenant '
                   'USING (tenant_id = current_setting(''kumiko.tenant_id'', true)) '
                   'WITH CHECK (tenant_id = current_setting(''kumiko.tenant_id'', true))', tbl);
    EXECUTE format('CREATE POLICY kumiko_owner_all ON %s TO %I USING (true) WITH CHECK (true)',
                   tbl, current_user);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %s TO kumiko_tenant', tbl);
END
$fn$;
-- +goose StatementEnd

-- CACHE 1 is load-bearing: a cached block lets an older transaction take a
-- lower position under an inherited commit key, inverting stream versions.
CREATE SEQUENCE kumiko_event_position_seq AS bigint CACHE 1;

-- One row per aggregate stream: its head version and the commit key of its
-- last event. The append statement updates it first, which locks it, so
-- concurrent appends to one stream serialise. Rows are never deleted.
CREATE TABLE streams (
    tenant_id       text   NOT NULL CHECK (tenant_id <> ''),
    stream_type     text   NOT NULL CHECK (stream_type <> ''),
    stream_id       text   NOT NULL CHECK (stream_id <> ''),
    version         bigint NOT NULL,
    last_commit_key xid8   NOT NULL,
    PRIMARY KEY (tenant_id, stream_type, stream_id)
);

-- The event log. Readers order by (commit_key, position) and only read below
-- the visibility horizon pg_snapshot_xmin(pg_current_snapshot()).
CREATE TABLE events (
    position     bigint      PRIMARY KEY,
    commit_key   xid8        NOT NULL,
    tenant_id    text        NOT NULL,
    stream_type  text        NOT NULL,
    stream_id    text        NOT NULL,
    version      bigint      NOT NULL CHECK (version > 0),
    type         text        NOT NULL,
    type_version int         NOT NULL DEFAULT 1,
    payload      jsonb       NOT NULL,
    metadata     jsonb       NOT NULL DEFAULT '{}'::jsonb,
    created_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, stream_type, stream_id, version)
);
CREATE INDEX events_order_idx ON events (commit_key, position);
CREATE INDEX events_type_idx ON events (type, commit_key, position);
CREATE INDEX events_created_idx ON events (created_at);

SELECT kumiko_enable_tenancy('streams');
SELECT kumiko_enable_tenancy('events');
-- The log is append-only for tenants: no UPDATE or DELETE.
REVOKE UPDATE, DELETE ON events FROM kumiko_tenant;
REVOKE DELETE ON streams FROM kumiko_tenant;
GRANT USAGE ON SEQUENCE kumiko_event_position_seq TO kumiko_tenant;

-- kumiko_version_conflict aborts an expected-version append whose stream
-- version differs, so a pipelined COMMIT after it cannot commit the rest of the
-- transaction without its events. SQLSTATE KU409.
-- +goose StatementBegin
CREATE FUNCTION kumiko_version_conflict(p_tenant text, p_type text, p_id text, p_expected bigint) RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE
    actual bigint;
BEGIN
    SELECT version INTO actual FROM streams
     WHERE tenant_id = p_tenant AND stream_type = p_type AND stream_id = p_id;
    RAISE EXCEPTION USING
        ERRCODE = 'KU409',
        MESSAGE = format('version conflict on stream %s/%s: expected version %s, actual %s',
                         p_type, p_id, p_expected, coalesce(actual, 0)),
        DETAIL = coalesce(actual, 0)::text;
END
$fn$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION kumiko_version_conflict(text, text, text, bigint);
DROP TABLE events;
DROP TABLE streams;
DROP SEQUENCE kumiko_event_position_seq;
DROP FUNCTION kumiko_enable_tenancy(regclass);

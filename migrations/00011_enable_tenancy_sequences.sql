-- +goose Up
-- kumiko_enable_tenancy also lets kumiko_tenant draw from the sequences the
-- table owns (a serial column's): without USAGE on them every insert of a
-- tenant's transaction failed with "permission denied for sequence", which
-- a client saw as 403 access_denied. An identity column needs no grant; it
-- gets one harmlessly. Tables enabled before keep the grants they have.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION kumiko_enable_tenancy(tbl regclass) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    seq regclass;
BEGIN
    EXECUTE format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', tbl);
    EXECUTE format('ALTER TABLE %s FORCE ROW LEVEL SECURITY', tbl);
    EXECUTE format('CREATE POLICY kumiko_tenant_isolation ON %s TO kumiko_tenant '
                   'USING (tenant_id = current_setting(''kumiko.tenant_id'', true)) '
                   'WITH CHECK (tenant_id = current_setting(''kumiko.tenant_id'', true))', tbl);
    EXECUTE format('CREATE POLICY kumiko_owner_all ON %s TO %I USING (true) WITH CHECK (true)',
                   tbl, current_user);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %s TO kumiko_tenant', tbl);
    FOR seq IN
        SELECT d.objid::regclass FROM pg_depend d JOIN pg_class s ON s.oid = d.objid
        WHERE d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_class'::regclass
          AND d.refobjid = tbl AND d.deptype IN ('a', 'i') AND s.relkind = 'S'
    LOOP
        EXECUTE format('GRANT USAGE ON SEQUENCE %s TO kumiko_tenant', seq);
    END LOOP;
END
$fn$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION kumiko_enable_tenancy(tbl regclass) RETURNS void
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

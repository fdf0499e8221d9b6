-- +goose Up
-- users: an address that differs only in case is the same user (mail
-- systems treat it so). The address stays stored as it was typed; only its
-- uniqueness per tenant ignores case. Fails when a tenant already holds two
-- such addresses: merge them first.
ALTER TABLE users DROP CONSTRAINT users_tenant_id_email_key;
CREATE UNIQUE INDEX users_tenant_id_lower_email_key ON users (tenant_id, lower(email));

-- +goose Down
DROP INDEX users_tenant_id_lower_email_key;
ALTER TABLE users ADD CONSTRAINT users_tenant_id_email_key UNIQUE (tenant_id, email);

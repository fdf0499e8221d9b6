-- +goose Up
-- framework/jobs: HandledOnce claims. A job inserts (tenant, key) in the same
-- transaction as its writes; the primary key makes a second claim a no-op, so
-- an effect guarded by it happens once however often the job is delivered.
CREATE TABLE handled (
    tenant_id  text        NOT NULL,
    key        text        NOT NULL CHECK (key <> ''),
    handled_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, key)
);
SELECT kumiko_enable_tenancy('handled');

-- orders:job:render-invoice writes one invoice per placed order.
CREATE TABLE invoices (
    tenant_id    text        NOT NULL,
    order_id     uuid        NOT NULL,
    number       text        NOT NULL,
    customer     text        NOT NULL,
    amount_cents bigint      NOT NULL,
    body         text        NOT NULL,
    rendered_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, order_id)
);
SELECT kumiko_enable_tenancy('invoices');

-- users:job:deliver-welcome-mail hands mails to a sender; the sample sender
-- records them here (no unique key: a duplicate delivery would show).
CREATE TABLE sent_mail (
    id         bigserial   PRIMARY KEY,
    tenant_id  text        NOT NULL,
    user_id    uuid        NOT NULL,
    to_address text        NOT NULL,
    subject    text        NOT NULL,
    body       text        NOT NULL,
    sent_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX sent_mail_tenant_idx ON sent_mail (tenant_id, id);
SELECT kumiko_enable_tenancy('sent_mail');
GRANT USAGE ON SEQUENCE sent_mail_id_seq TO kumiko_tenant;

-- users:job:nightly-report (cron) appends one row per run; no unique key on
-- the tick, so a tick that ran twice would show.
CREATE TABLE nightly_reports (
    id         bigserial   PRIMARY KEY,
    tick       timestamptz NOT NULL,
    tenants    bigint      NOT NULL,
    users      bigint      NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX nightly_reports_tick_idx ON nightly_reports (tick);

-- +goose Down
DROP TABLE nightly_reports;
DROP TABLE sent_mail;
DROP TABLE invoices;
DROP TABLE handled;

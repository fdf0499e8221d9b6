-- +goose Up
-- orders:order-totals, a multi-stream projection's table: order count and
-- amount per customer, cancelled orders subtracted.
CREATE TABLE order_totals (
    tenant_id    text   NOT NULL,
    customer     text   NOT NULL,
    orders       bigint NOT NULL DEFAULT 0,
    amount_cents bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, customer)
);
SELECT kumiko_enable_tenancy('order_totals');

-- The users feature.
CREATE TABLE users (
    tenant_id  text        NOT NULL,
    id         uuid        NOT NULL,
    email      text        NOT NULL,
    invited_by text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, id),
    UNIQUE (tenant_id, email)
);
SELECT kumiko_enable_tenancy('users');

-- users:send-welcome-email, a side-effect projection's log (idempotent on
-- the user id).
CREATE TABLE welcome_log (
    tenant_id  text        NOT NULL,
    user_id    uuid        NOT NULL,
    email      text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, user_id)
);
SELECT kumiko_enable_tenancy('welcome_log');

-- +goose Down
DROP TABLE welcome_log;
DROP TABLE users;
DROP TABLE order_totals;

-- +goose Up
-- The orders feature's business table (features/orders).
CREATE TABLE orders (
    tenant_id    text        NOT NULL,
    id           uuid        NOT NULL,
    customer     text        NOT NULL,
    amount_cents bigint      NOT NULL CHECK (amount_cents >= 0),
    status       text        NOT NULL DEFAULT 'placed',
    version      bigint      NOT NULL DEFAULT 1,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, id)
);
SELECT kumiko_enable_tenancy('orders');

-- +goose Down
DROP TABLE orders;

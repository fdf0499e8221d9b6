-- +goose Up
-- orders:order-totals is one consumer shared by every tenant: an event it
-- fails on stops it for all of them. The per-order cap (10^12 cents) does
-- not keep a bigint sum from overflowing (about 9.2 million capped orders of
-- one customer reach it), so one tenant could stop every tenant's totals.
-- A numeric sum cannot overflow; orders:query:totals reads it capped at
-- the bigint maximum.
ALTER TABLE order_totals ALTER COLUMN amount_cents TYPE numeric;

-- +goose Down
ALTER TABLE order_totals ALTER COLUMN amount_cents TYPE bigint;

-- +goose Up
-- framework/retention: what a prune deleted, per tenant, stream type and
-- event type: the place (commit key, position) of the last deleted event in
-- delivery order. A reader that resumes from a cursor (an SSE client's
-- Last-Event-ID) checks it: an event it reads that was deleted after its
-- cursor is gone from the replay, so it must start afresh instead of
-- silently missing it. One row per (tenant, stream type, type): bounded.
CREATE TABLE event_prune_marks (
    tenant_id   text        NOT NULL,
    stream_type text        NOT NULL,
    type        text        NOT NULL,
    commit_key  xid8        NOT NULL,
    position    bigint      NOT NULL,
    pruned_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, stream_type, type)
);
SELECT kumiko_enable_tenancy('event_prune_marks');
-- Tenants read their marks; only the prune (the owner) writes them.
REVOKE INSERT, UPDATE, DELETE ON event_prune_marks FROM kumiko_tenant;

-- +goose Down
DROP TABLE event_prune_marks;

-- +goose Up
-- One row per consumer cursor: (name, '__shared__') for shared delivery,
-- (name, <instance id>) for per-instance delivery. The dispatcher
-- serialises passes with a transaction-scoped advisory lock on the pair,
-- not with a row lock (FOR UPDATE would give every pass an xid at once and
-- hold back every reader's horizon for the pass).
CREATE TABLE event_consumers (
    name              text        NOT NULL,
    instance_id       text        NOT NULL,
    status            text        NOT NULL DEFAULT 'idle'
                      CHECK (status IN ('idle', 'dead', 'disabled')),
    -- Event types the consumer reads; NULL means every type.
    event_types       text[],
    cursor_commit_key xid8        NOT NULL DEFAULT '0',
    cursor_position   bigint      NOT NULL DEFAULT 0,
    attempts          int         NOT NULL DEFAULT 0,
    failed_position   bigint,
    last_error        text,
    next_attempt_at   timestamptz,
    dead_at           timestamptz,
    revivals          int         NOT NULL DEFAULT 0,
    events_processed  bigint      NOT NULL DEFAULT 0,
    heartbeat_at      timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    created_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, instance_id)
);

-- Events a consumer with SkipApplyErrors (or an operator's skip) moved past.
CREATE TABLE event_dead_letters (
    id          bigserial   PRIMARY KEY,
    consumer    text        NOT NULL,
    instance_id text        NOT NULL,
    position    bigint      NOT NULL,
    event_type  text        NOT NULL,
    tenant_id   text        NOT NULL,
    error       text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX event_dead_letters_consumer_idx ON event_dead_letters (consumer, instance_id, created_at);

-- +goose Down
DROP TABLE event_dead_letters;
DROP TABLE event_consumers;

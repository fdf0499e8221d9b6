// Package migrations embeds Kumiko's SQL migrations (goose format). They are
// applied by framework/migrate under goose's Postgres session lock, so several
// processes starting at once migrate the database exactly once.
//
// File names are NNNNN_description.sql; never edit a migration that has shipped,
// add a new one instead.
package migrations

import "embed"

// FS holds every *.sql migration of this directory.
//
//go:embed *.sql
var FS embed.FS

package cli

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
)

// redisLogger routes go-redis's own messages (failed dials during an
// outage, pool and pub/sub notices) into the process's JSON log, as
// warnings, instead of plain text on stderr.
type redisLogger struct{ log *slog.Logger }

// Printf implements go-redis's logging interface.
func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	msg := strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: ")
	l.log.LogAttrs(ctx, slog.LevelWarn, "redis client", slog.String("detail", msg))
}

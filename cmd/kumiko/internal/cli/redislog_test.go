package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRedisLoggerWritesJSONWarnings(t *testing.T) {
	var buf bytes.Buffer
	redisLogger{log: logger(&buf, slog.LevelInfo)}.Printf(context.Background(),
		"redis: connection pool: failed to dial after %d attempts: %v", 5, "connection refused")
	var rec map[string]any
	require.NoError(t, json.Unmarshal(buf.Bytes(), &rec), "one JSON record: %s", buf.String())
	require.Equal(t, "WARN", rec["level"])
	require.Equal(t, "redis client", rec["msg"])
	require.Equal(t, "connection pool: failed to dial after 5 attempts: connection refused", rec["detail"])
}

package raftnode

import (
	"context"
	"log/slog"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// newHclogAdapter routes raft's hclog output into slog, keeping its level.
func newHclogAdapter(logger *slog.Logger) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name:        "raft",
		Level:       hclog.Info,
		Output:      &slogWriter{logger: logger},
		DisableTime: true,
	})
}

type slogWriter struct{ logger *slog.Logger }

var hclogLevels = []struct {
	tag   string
	level slog.Level
}{{"[ERROR]", slog.LevelError}, {"[WARN]", slog.LevelWarn}, {"[DEBUG]", slog.LevelDebug}, {"[TRACE]", slog.LevelDebug}}

func (w *slogWriter) Write(p []byte) (int, error) {
	line := strings.TrimRight(string(p), "\r\n")
	level := slog.LevelInfo
	for _, l := range hclogLevels {
		if strings.HasPrefix(line, l.tag) {
			level = l.level
			line = strings.TrimSpace(line[len(l.tag):])
			break
		}
	}
	line = strings.TrimPrefix(strings.TrimPrefix(line, "[INFO]"), " ")
	w.logger.Log(context.Background(), level, strings.TrimSpace(line))
	return len(p), nil
}

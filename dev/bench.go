package main

import (
	"context"
	"errors"
	"log/slog"
)

func bench(ctx context.Context, root, state string, args []string, log *slog.Logger) error {
	return errors.New("bench: not written yet")
}

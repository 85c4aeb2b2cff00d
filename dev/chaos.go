package main

import (
	"context"
	"errors"
	"log/slog"
)

func chaos(ctx context.Context, root, state string, args []string, log *slog.Logger) error {
	return errors.New("todo")
}

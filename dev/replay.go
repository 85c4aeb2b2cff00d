package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"

	"github.com/anneal-dev/anneal/dev/replay"
)

// replayCmd replays the executions of a running installation against the
// workflow code of this checkout and fails when any would break.
func replayCmd(ctx context.Context, state string, args []string, log *slog.Logger) error {
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	var conn temporalConn
	conn.addFlags(fs, state, true)
	since := fs.Duration("since", replay.DefaultSince, "also replay executions closed within this long (open ones always)")
	if err := fs.Parse(args); err != nil {
		return flagError(err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("replay: unexpected arguments %q", fs.Args())
	}
	c, err := conn.dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	res, err := replay.Run(ctx, replay.Options{
		Client: c, Namespace: conn.namespace, TaskQueue: conn.taskQueue, Since: *since, Log: log, Keys: conn.keys,
	})
	if err != nil {
		return err
	}
	fmt.Print(res.Summary())
	if len(res.Broken) > 0 {
		return &exitError{code: 1}
	}
	return nil
}

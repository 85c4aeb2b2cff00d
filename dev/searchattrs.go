package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"sort"
	"strings"

	"github.com/anneal-dev/anneal/dev/devenv"
	"github.com/anneal-dev/anneal/workflows/contract"
)

// searchAttributesCmd registers anneal's custom search attributes on a
// namespace (idempotently), for an installation whose Temporal `dev` does
// not run.
func searchAttributesCmd(ctx context.Context, state string, args []string, log *slog.Logger) error {
	fs := flag.NewFlagSet("search-attributes", flag.ContinueOnError)
	var conn temporalConn
	conn.addFlags(fs, state, false)
	if err := fs.Parse(args); err != nil {
		return flagError(err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("search-attributes: unexpected arguments %q", fs.Args())
	}
	c, err := conn.dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	attrs := contract.SearchAttributes()
	added, err := devenv.RegisterSearchAttributes(ctx, c, conn.namespace, attrs)
	if err != nil {
		return err
	}
	var all []string
	for name, typ := range attrs {
		all = append(all, fmt.Sprintf("%s (%s)", name, typ))
	}
	sort.Strings(all)
	if len(added) == 0 {
		fmt.Printf("namespace %s at %s already has anneal's search attributes: %s\n", conn.namespace, conn.address, strings.Join(all, ", "))
		return nil
	}
	fmt.Printf("namespace %s at %s: added %s; anneal's search attributes are %s\n", conn.namespace, conn.address, strings.Join(added, ", "), strings.Join(all, ", "))
	return nil
}

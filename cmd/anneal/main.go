// Command anneal is the operator's command-line client of the anneal REST
// API: status tables, graph execution followed live, transactions, logs,
// snapshots, scenarios and tokens. See `anneal --help`.
package main

import (
	"os"

	"github.com/anneal-dev/anneal/cmd/anneal/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

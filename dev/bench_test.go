package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/web"
)

// TestSetAsideKeepsRecentBenches: the previous bench's directory is moved
// out of the way and kept, as is one set aside an hour ago; one set aside
// two days ago is deleted once the rounds are over.
func TestSetAsideKeepsRecentBenches(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	dir := filepath.Join(state, "bench")
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "nodes"), 0o755))
	hourOld := fmt.Sprintf("%s.old-%d", dir, time.Now().Add(-time.Hour).UnixNano())
	daysOld := fmt.Sprintf("%s.old-%d", dir, time.Now().Add(-48*time.Hour).UnixNano())
	for _, d := range []string{hourOld, daysOld} {
		require.NoError(t, os.MkdirAll(filepath.Join(d, "nodes"), 0o755))
	}

	removeOld, err := setAside(dir)
	require.NoError(t, err)
	assert.NoDirExists(t, dir, "the previous bench is moved out of the way")
	removeOld()

	olds, err := filepath.Glob(dir + ".old-*")
	require.NoError(t, err)
	assert.Len(t, olds, 2, "the previous bench and the one set aside an hour ago are kept")
	assert.Contains(t, olds, hourOld)
	assert.NoDirExists(t, daysOld, "a bench set aside two days ago is deleted")
}

// The bench's WAL figure follows what Postgres writes: the insert position
// moves on with a write, and the figure per run is the difference.
func TestWALPerRun(t *testing.T) {
	url := testenv.Database(t)
	ctx := context.Background()
	from := walPosition(ctx, url)
	require.NotZero(t, from)
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "create table wal_probe (x text); insert into wal_probe select repeat(md5(i::text), 32) from generate_series(1, 100) i")
	require.NoError(t, err)
	to := walPosition(ctx, url)
	assert.Greater(t, to-from, int64(100*1000), "a hundred rows of a kilobyte")
	assert.Equal(t, "not measured", walPerRun(0, to, 10))
	assert.Equal(t, "1000 bytes per run (0.0 MB in all; the whole cluster)", walPerRun(1000, 11000, 10))
}

// The own CPU figure is the median over the rounds of each round's, the
// rounds listed in the order they ran; a round with no runs counts for
// nothing.
func TestOwnCPUMedian(t *testing.T) {
	round := func(total, server float64) roundResult {
		return roundResult{runs: 1000, annealCPU: cpuUse{total: total, server: server}}
	}
	rs := []roundResult{round(6.4, 3.0), round(6.1, 3.1), round(6.0, 3.1), {}}
	line, ms := ownCPUMedian(rs)
	assert.Equal(t, "3.00 ms median of the rounds' (machine minus Temporal server; rounds in order: 3.40 3.00 2.90)", line)
	assert.InDelta(t, 3.0, ms, 1e-9)
	line, ms = ownCPUMedian(rs[:2])
	assert.Equal(t, "3.20 ms median of the rounds' (machine minus Temporal server; rounds in order: 3.40 3.00)", line)
	assert.InDelta(t, 3.2, ms, 1e-9)
	line, ms = ownCPUMedian(rs[3:])
	assert.Equal(t, "median of rounds: none ran", line)
	assert.Zero(t, ms)
}

// The own CPU per run over the bare server's CPU per activity is taken
// round by round, its median over the rounds that ran both sides.
func TestOwnPerBareServer(t *testing.T) {
	round := func(total, server, bareServer float64) roundResult {
		return roundResult{runs: 1000, annealCPU: cpuUse{total: total, server: server}, bareCPU: cpuUse{server: bareServer}}
	}
	rs := []roundResult{round(6.4, 3.0, 13.6), round(6.1, 3.1, 12.0), round(6.0, 3.1, 14.5), {}, {runs: 1000, annealCPU: cpuUse{total: 6, server: 3}}}
	assert.Equal(t, "0.250 median of the rounds' (rounds in order: 0.250 0.250 0.200)", ownPerBareServer(rs, 1000))
	assert.Equal(t, "0.500 median of the rounds' (rounds in order: 0.500 0.500 0.400)", ownPerBareServer(rs, 2000), "bare activities counted apart from anneal's runs")
	assert.Equal(t, "no round ran both sides", ownPerBareServer(rs[3:], 1000))
}

// Statements are ranked by execution time; their planning shows beside it
// only when the server tracked some, and the short list is cut to n.
func TestRankStatements(t *testing.T) {
	stmts := []statementStats{
		{calls: 100, ms: 20, rows: 100, query: "SELECT  a\n FROM t"},
		{calls: 10, ms: 50, plans: 10, planMS: 4.5, rows: 10, query: "UPDATE t SET b = 1"},
		{calls: 1, ms: 5, rows: 1, query: "ANALYZE t"},
	}
	short, full := rankStatements(stmts, 3, 2, "/tmp/s.txt")
	assert.Equal(t, "  Postgres: 3 connections opened during the phase; statements: 111 calls, 0.1 s executing and 0.0 s planning; top 2 by total execution time (all in /tmp/s.txt):\n"+
		"          10 calls      50.0 ms  66.7% (10 plans, 4.5 ms)  UPDATE t SET b = 1\n"+
		"         100 calls      20.0 ms  26.7% (0 plans, 0.0 ms)  SELECT a FROM t\n", short)
	lines := strings.Split(strings.TrimSuffix(full, "\n"), "\n")
	require.Len(t, lines, 3, "every statement in the full list")
	assert.Contains(t, lines[0], "10 plans       4.5 ms planning")
	assert.True(t, strings.HasSuffix(lines[2], "ANALYZE t"), lines[2])
	assert.Equal(t, "SELECT  a\n FROM t", stmts[0].query, "the caller's list untouched")

	for i := range stmts {
		stmts[i].plans, stmts[i].planMS = 0, 0
	}
	short, _ = rankStatements(stmts, 0, 1, "/tmp/s.txt")
	assert.Equal(t, "  Postgres: 0 connections opened during the phase; statements: 111 calls, 0.1 s executing; top 1 by total execution time (all in /tmp/s.txt):\n"+
		"          10 calls      50.0 ms  66.7%  UPDATE t SET b = 1\n", short, "no planning shown when none was tracked")
}

// TestMeasureMachine: the reference work costs CPU, the shells' counted
// with the starting thread's, and four times the JSON round trips cost
// about four times the CPU (the measure is the thread's, not the wall
// clock's).
func TestMeasureMachine(t *testing.T) {
	ref, err := measureMachine(20, 500)
	require.NoError(t, err)
	assert.Positive(t, ref.exec, "starting a shell costs CPU")
	assert.Less(t, ref.exec, 100*time.Millisecond, "one shell, not all of them")
	assert.Positive(t, ref.json)
	t.Logf("on this machine: %v per shell, %v for 500 JSON round trips", ref.exec, ref.json)

	more, err := measureMachine(1, 2000)
	require.NoError(t, err)
	ratio := float64(more.json) / float64(ref.json)
	assert.InDelta(t, 4, ratio, 2, "the CPU grows with the round trips: %v for 500, %v for 2000", ref.json, more.json)
}

// TestReferenceLine: the references before and after the rounds, and the
// own CPU per run in shells; none measured is a dash, not a division.
func TestReferenceLine(t *testing.T) {
	before := machineReference{exec: 1200 * time.Microsecond, json: 180 * time.Millisecond}
	after := machineReference{exec: 1300 * time.Microsecond, json: 190 * time.Millisecond}
	line := referenceLine(before, after, 6.0)
	assert.Contains(t, line, "`/bin/sh -c true` 1.20 / 1.30 ms CPU each")
	assert.Contains(t, line, "2000 JSON round trips 180 / 190 ms CPU")
	assert.Contains(t, line, "is 5.0 times the reference shell's")
	assert.Contains(t, referenceLine(before, after, 0), "is - times")
}

func TestBusyTicks(t *testing.T) {
	// user nice system idle iowait irq softirq steal guest guest_nice
	line := "cpu  1000 20 300 5000 70 4 60 900 800 7"
	assert.Equal(t, float64(1000+20+300+4+60), busyTicks(line), "user, nice, system, irq and softirq; not idle, iowait, steal or guest time")
	assert.Equal(t, float64(3), busyTicks("cpu 1 1 1"), "an older kernel's shorter line")
}

// TestBenchReleaseCrossNode: the bench graph's middle task waits for the
// anchor's task before it, unless --cross-node=false; the chain is whole
// either way.
func TestBenchReleaseCrossNode(t *testing.T) {
	for _, cross := range []bool{true, false} {
		spec, err := web.ParseRelease([]byte(benchRelease(6, cross)), "application/yaml")
		require.NoError(t, err)
		tasks := spec.Graphs["bench"].Tasks
		require.Len(t, tasks, 6)
		var crossed []string
		for i, task := range tasks {
			if i > 0 {
				assert.Equal(t, []string{tasks[i-1].ID}, task.Requires, "task %s", task.ID)
			}
			for _, d := range task.CrossDepends {
				crossed = append(crossed, task.ID+" after "+d.Name)
			}
		}
		if cross {
			assert.Equal(t, []string{"t4 after t3"}, crossed)
		} else {
			assert.Empty(t, crossed)
		}
	}
}

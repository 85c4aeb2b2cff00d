package main

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// The bench's figures are CPU times, and this machine's speed moves: the
// same build's own CPU per run went from 3.0 to 4.0 ms within one
// session, and to 6 to 7 ms on the next session's machine, every process
// dearer by about the same factor. A reference measured beside the rounds
// tells the machine's change from anneal's. machineReference is what two
// fixed pieces of work cost: what every task run costs an agent's host
// (starting a shell that does nothing: the kernel's and the hypervisor's
// share), and computation of the kind the worker and the API do most
// (encoding and decoding JSON: allocation, reflection, small copies).

// referenceExecs and referenceJSONRounds size the reference work: about a
// third of a second each on the 2-core machine of the bench's README.
const (
	referenceExecs      = 200
	referenceJSONRounds = 2000
)

// machineReference is the CPU two fixed pieces of work cost the machine.
type machineReference struct {
	// exec is the CPU of starting and reaping one `/bin/sh -c true`, the
	// child's and the starting thread's.
	exec time.Duration
	// json is the CPU of referenceJSONRounds round trips of referenceDoc
	// through encoding/json.
	json time.Duration
}

// measureMachine measures a machineReference with execs shells, on one
// locked OS thread so that its own CPU is that thread's alone
// (RUSAGE_THREAD), whatever else this process runs meanwhile; the
// shells' CPU is the reaped children's (RUSAGE_CHILDREN), and nothing
// else of the bench's is reaped meanwhile (agent hosts and the servers
// run until the bench ends).
func measureMachine(execs, jsonRounds int) (machineReference, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var ref machineReference

	// Warmed up first: the heap grown, the shell's pages cached.
	doc := referenceDoc()
	if err := jsonRoundTrips(doc, jsonRounds/10); err != nil {
		return ref, err
	}
	if err := exec.Command("/bin/sh", "-c", "true").Run(); err != nil {
		return ref, fmt.Errorf("start /bin/sh -c true: %w", err)
	}

	thread0, children0, err := threadAndChildrenCPU()
	if err != nil {
		return ref, err
	}
	for range execs {
		if err := exec.Command("/bin/sh", "-c", "true").Run(); err != nil {
			return ref, fmt.Errorf("start /bin/sh -c true: %w", err)
		}
	}
	thread1, children1, err := threadAndChildrenCPU()
	if err != nil {
		return ref, err
	}
	ref.exec = (thread1 - thread0 + children1 - children0) / time.Duration(max(execs, 1))

	if err := jsonRoundTrips(doc, jsonRounds); err != nil {
		return ref, err
	}
	thread2, _, err := threadAndChildrenCPU()
	if err != nil {
		return ref, err
	}
	ref.json = thread2 - thread1
	return ref, nil
}

// jsonRoundTrips encodes doc and decodes it again, rounds times.
func jsonRoundTrips(doc any, rounds int) error {
	for range rounds {
		raw, err := json.Marshal(doc)
		if err != nil {
			return fmt.Errorf("encode the reference document: %w", err)
		}
		var back any
		if err := json.Unmarshal(raw, &back); err != nil {
			return fmt.Errorf("decode the reference document: %w", err)
		}
	}
	return nil
}

// referenceDoc is a fixed document of about 2 KB, shaped as a task run's
// work item: an object of strings and numbers, a list of such objects.
func referenceDoc() map[string]any {
	runs := make([]map[string]any, 20)
	for i := range runs {
		runs[i] = map[string]any{"id": 1000 + i, "task": fmt.Sprintf("task-%02d", i), "state": "pending",
			"attempt": 1, "command": "true", "env": map[string]string{"ANNEAL_RUN": fmt.Sprint(1000 + i)}}
	}
	return map[string]any{"transaction": "tx-4fb88983-6ca1-4417-bad7-0316d753a812", "node": "bench-001.anneal.test", "runs": runs}
}

// threadAndChildrenCPU returns the calling thread's CPU (user and system)
// and that of this process's reaped children.
func threadAndChildrenCPU() (thread, children time.Duration, err error) {
	var t, c unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &t); err != nil {
		return 0, 0, fmt.Errorf("getrusage(RUSAGE_THREAD): %w", err)
	}
	if err := unix.Getrusage(unix.RUSAGE_CHILDREN, &c); err != nil {
		return 0, 0, fmt.Errorf("getrusage(RUSAGE_CHILDREN): %w", err)
	}
	return rusageCPU(t), rusageCPU(c), nil
}

// rusageCPU is a rusage's user and system time.
func rusageCPU(r unix.Rusage) time.Duration {
	return time.Duration(r.Utime.Nano() + r.Stime.Nano())
}

// referenceLine formats the references measured before and after the
// rounds, and anneal's own CPU per run (ms; 0: none measured) in units of
// the exec reference before them: a figure the machine's speed moves less.
func referenceLine(before, after machineReference, ownPerRunMs float64) string {
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	units := "-"
	if before.exec > 0 && ownPerRunMs > 0 {
		units = fmt.Sprintf("%.1f", ownPerRunMs/ms(before.exec))
	}
	return fmt.Sprintf("machine reference, before the rounds / after: `/bin/sh -c true` %.2f / %.2f ms CPU each; %d JSON round trips %.0f / %.0f ms CPU\n"+
		"                                 anneal's own CPU per run is %s times the reference shell's (before the rounds)",
		ms(before.exec), ms(after.exec), referenceJSONRounds, ms(before.json), ms(after.json), units)
}

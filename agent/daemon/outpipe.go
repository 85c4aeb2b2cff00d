package daemon

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// outputPipe carries one of a command's output streams (stdout or
// stderr) to a writer. Its write end goes to the command as an *os.File,
// which os/exec hands over as it is. Given an io.Writer instead, os/exec
// makes the pipe with os.Pipe, which registers both ends with the
// runtime's poller and then turns the command's end back to blocking: six
// fcntl and two epoll_ctl calls more per stream, on the agent's path of
// every run. Here only the read end, the agent's, is polled; the copy
// reads through a pooled buffer rather than the 32 KiB os/exec's copy
// allocates per stream and run.
type outputPipe struct {
	r, w *os.File
	done chan struct{}
}

// newOutputPipe makes the pipe: both ends close-on-exec (os/exec dups the
// write end onto the command's descriptor), the read end non-blocking so
// that os.NewFile lets the poller wait on it.
func newOutputPipe() (*outputPipe, error) {
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC); err != nil {
		return nil, fmt.Errorf("make a pipe for the command's output: %w", err)
	}
	if _, err := unix.FcntlInt(uintptr(fds[0]), unix.F_SETFL, unix.O_NONBLOCK); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, fmt.Errorf("make a pipe for the command's output: %w", err)
	}
	r := os.NewFile(uintptr(fds[0]), "|0")
	if errors.Is(r.SetReadDeadline(time.Time{}), os.ErrNoDeadline) {
		// The poller did not take it (its limit of watched descriptors
		// reached, say). Read blocking, its copy could not be stopped
		// when background processes hold the pipe (waitOutputs); the run
		// fails instead, saying why.
		r.Close()
		unix.Close(fds[1])
		return nil, errors.New("make a pipe for the command's output: the Go runtime's poller did not take it (too many descriptors watched?)")
	}
	return &outputPipe{r: r, w: os.NewFile(uintptr(fds[1]), "|1"), done: make(chan struct{})}, nil
}

// newOutputPipes makes the command's stdout and stderr pipes, or neither.
func newOutputPipes() (stdout, stderr *outputPipe, err error) {
	if stdout, err = newOutputPipe(); err != nil {
		return nil, nil, err
	}
	if stderr, err = newOutputPipe(); err != nil {
		stdout.close()
		return nil, nil, err
	}
	return stdout, stderr, nil
}

// copyBuffers are the output copies' buffers: most commands write little,
// and a run's two copies need not allocate 64 KiB for it.
var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 16<<10); return &b }}

// start copies what the command writes to dst until every writer has
// closed the pipe or waitOutputs closes its read end. Call it once the
// command has started, which is when the agent closes its own copy of
// the write end (the command and whatever it starts keep theirs).
func (p *outputPipe) start(dst io.Writer) {
	p.w.Close()
	go func() {
		defer close(p.done)
		buf := copyBuffers.Get().(*[]byte)
		defer copyBuffers.Put(buf)
		// Without WriteTo, which *os.File has and which would copy
		// through a buffer of its own.
		_, _ = io.CopyBuffer(dst, struct{ io.Reader }{p.r}, *buf)
	}()
}

// close closes both ends, for a command that did not start.
func (p *outputPipe) close() {
	p.w.Close()
	p.r.Close()
}

// waitOutputs waits for the copies of pipes, started, to end: at once
// when the command's processes have all exited, as they close the pipes.
// Processes it started in the background may keep them open; after grace
// the agent stops reading (what they write later is lost, and they get
// SIGPIPE), as os/exec's WaitDelay did. It returns whether it had to.
func waitOutputs(grace time.Duration, pipes ...*outputPipe) (cutShort bool) {
	timer := time.NewTimer(grace)
	defer timer.Stop()
	for _, p := range pipes {
		select {
		case <-p.done:
		case <-timer.C:
			cutShort = true
		}
		if cutShort {
			break
		}
	}
	for _, p := range pipes {
		p.r.Close() // a copy still reading returns at once
		<-p.done
	}
	return cutShort
}

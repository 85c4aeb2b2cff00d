package daemon_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/agent/daemon"
	"github.com/anneal-dev/anneal/agent/protocol"
)

type logKey struct {
	run     int64
	attempt int
}

type logPost struct {
	offset int64
	n      int
	at     time.Time
}

// fakeLogs keeps the shipped logs as the API does: idempotent by offset, a
// chunk past the end refused with the offset to send from.
type fakeLogs struct {
	data        map[logKey][]byte
	size        map[logKey]int64
	posts       map[logKey][]logPost
	failures    int            // answer 503 to this many posts first, storing nothing
	lostAnswers int            // then store this many posts but answer 503
	cap         int            // keep at most this many bytes (0: all)
	withResult  map[logKey]int // chunks that came with a result
}

func newFakeLogs() *fakeLogs {
	return &fakeLogs{data: map[logKey][]byte{}, size: map[logKey]int64{}, posts: map[logKey][]logPost{}, withResult: map[logKey]int{}}
}

func (f *fakeAPI) runLog(w http.ResponseWriter, r *http.Request) {
	f.record(r)
	if !f.authorized(w, r) {
		return
	}
	attempt, _ := strconv.Atoi(r.URL.Query().Get("attempt"))
	offset, err := strconv.ParseInt(r.URL.Query().Get("offset"), 10, 64)
	body, _ := io.ReadAll(r.Body)
	if attempt < 1 || err != nil || r.Header.Get("Content-Type") != "application/octet-stream" {
		apiError(w, http.StatusBadRequest, "invalid_input", "attempt, offset and an octet stream are required")
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	l, k := f.logs, logKey{runID(r), attempt}
	l.posts[k] = append(l.posts[k], logPost{offset: offset, n: len(body), at: time.Now()})
	if l.failures > 0 {
		l.failures--
		apiError(w, http.StatusServiceUnavailable, "unavailable", "try later")
		return
	}
	if size, ok := l.store(k, offset, body); !ok {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusConflict)
		fmt.Fprintf(w, `{"error":{"code":"invalid_input","message":"send from %d","details":{"field":"offset","offset":%d}}}`, size, size)
		return
	}
	if l.lostAnswers > 0 {
		l.lostAnswers--
		apiError(w, http.StatusServiceUnavailable, "unavailable", "stored, but the answer is lost")
		return
	}
	writeJSON(w, protocol.RunLogState{Offset: l.size[k], Stored: int64(len(l.data[k])),
		Truncated: l.cap > 0 && l.size[k] > int64(l.cap)})
}

// store keeps a chunk of a log (the caller holds f.mu): idempotent by
// offset; false, with the size the server has, when it starts past it.
func (l *fakeLogs) store(k logKey, offset int64, body []byte) (int64, bool) {
	size := l.size[k]
	if truncated := l.cap > 0 && size > int64(l.cap); truncated && offset > size {
		l.size[k] = offset + int64(len(body)) // nothing more is kept: only the length counts
		size = l.size[k]
	}
	if offset > size {
		return size, false
	}
	if skip := size - offset; skip < int64(len(body)) {
		fresh := body[skip:]
		l.size[k] += int64(len(fresh))
		keep := len(fresh)
		if l.cap > 0 {
			keep = max(0, min(keep, l.cap-len(l.data[k])))
		}
		l.data[k] = append(l.data[k], fresh[:keep]...)
	}
	return l.size[k], true
}

func (f *fakeAPI) shippedLog(run int64, attempt int) ([]byte, []logPost) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := logKey{run, attempt}
	return bytes.Clone(f.logs.data[k]), append([]logPost(nil), f.logs.posts[k]...)
}

// TestLogShippedWhileRunning: a run's log reaches the API while the command
// still runs, and all of it before the result.
func TestLogShippedWhileRunning(t *testing.T) {
	f := newFakeAPI(t)
	dir := t.TempDir()
	cfg := testConfig(t, f, dir)
	cfg.LogShipEvery = 50 * time.Millisecond
	start(t, cfg)

	f.push(work(90, 1, `for i in 1 2 3 4 5 6 7 8 9 10; do echo "line $i"; echo "warn $i" >&2; sleep 0.1; done`))
	// Live: some of the log is on the server before the command is done.
	require.Eventually(t, func() bool {
		data, _ := f.shippedLog(90, 1)
		return bytes.Contains(data, []byte("out| line 2\n"))
	}, 5*time.Second, 10*time.Millisecond)
	f.mu.Lock()
	assert.Empty(t, f.results[90], "the log arrives while the run goes on")
	f.mu.Unlock()

	res := f.waitResults(t, 90, 1)[0]
	require.True(t, res.Succeeded())
	data, posts := f.shippedLog(90, 1)
	file, err := os.ReadFile(filepath.Join(dir, "logs", "tx-e2e", "task90.90.1.log"))
	require.NoError(t, err)
	assert.Equal(t, string(file), string(data), "the API has the whole log, byte for byte")
	assert.Contains(t, string(data), "# finished ", "the footer too: shipped after the command ended")
	assert.Greater(t, len(posts), 2, "shipped in several chunks as it grew")
	for i := 1; i < len(posts); i++ {
		assert.Equal(t, posts[i-1].offset+int64(posts[i-1].n), posts[i].offset, "each chunk starts where the last ended")
	}
}

// TestLogChunkingAndResume: a large log goes in chunks of at most
// LogChunkBytes; failed posts and lost answers are retried without a byte
// stored twice; after an agent restart, the log of a run the dead process
// had started is shipped from where the server's copy ends.
func TestLogChunkingAndResume(t *testing.T) {
	f := newFakeAPI(t)
	f.logs.failures, f.logs.lostAnswers = 2, 2
	dir := t.TempDir()
	cfg := testConfig(t, f, dir)
	cfg.LogShipEvery = 20 * time.Millisecond
	stop, _ := start(t, cfg)

	// About 700 KiB at once: three chunks at least.
	f.push(work(91, 1, `i=0; while [ $i -lt 10000 ]; do printf '%070d\n' $i; i=$((i+1)); done`))
	require.True(t, f.waitResults(t, 91, 1)[0].Succeeded())
	data, posts := f.shippedLog(91, 1)
	file, err := os.ReadFile(filepath.Join(dir, "logs", "tx-e2e", "task91.91.1.log"))
	require.NoError(t, err)
	require.Greater(t, len(file), 2*daemon.LogChunkBytes)
	assert.Equal(t, len(file), len(data))
	assert.True(t, bytes.Equal(file, data), "the whole log, no chunk stored twice or lost")
	for _, p := range posts {
		assert.LessOrEqual(t, p.n, daemon.LogChunkBytes)
	}
	require.NoError(t, stop())
	f.waitNoPolls(t)

	// A run the previous process started and never finished: its log file
	// is on disk, the server has its first 100 bytes.
	recs := &daemon.Records{Dir: filepath.Join(dir, daemon.RecordsDir)}
	require.NoError(t, recs.SaveRun(&daemon.RunRecord{RunID: 92, Attempt: 1, Task: "task92", TransactionID: "tx-e2e",
		Type: "shell", Phase: daemon.PhaseStarted}))
	logPath := filepath.Join(dir, "logs", "tx-e2e", "task92.92.1.log")
	want := []byte(strings.Repeat("out| before the agent died\n", 200))
	require.NoError(t, os.WriteFile(logPath, want, 0o644))
	f.mu.Lock()
	f.logs.data[logKey{92, 1}] = bytes.Clone(want[:100])
	f.logs.size[logKey{92, 1}] = 100
	f.mu.Unlock()

	cfg.EnrollToken = ""
	start(t, cfg)
	failed := f.waitResults(t, 92, 1)[0]
	assert.Contains(t, failed.Error, "interrupted")
	data, posts = f.shippedLog(92, 1)
	assert.Equal(t, string(want), string(data), "resumed where the server's copy ended")
	var sent int
	for _, p := range posts {
		sent += p.n
	}
	assert.LessOrEqual(t, sent, len(want), "at most one chunk overlaps what the server had")
}

// TestLogTruncatedSkipsAhead: once the API says it keeps no more, the agent
// sends only the log's length, not its bytes.
func TestLogTruncatedSkipsAhead(t *testing.T) {
	f := newFakeAPI(t)
	f.logs.cap = 1000
	dir := t.TempDir()
	cfg := testConfig(t, f, dir)
	cfg.LogShipEvery = 20 * time.Millisecond
	start(t, cfg)

	f.push(work(93, 1, `i=0; while [ $i -lt 5000 ]; do printf '%070d\n' $i; i=$((i+1)); done`))
	require.True(t, f.waitResults(t, 93, 1)[0].Succeeded())
	data, posts := f.shippedLog(93, 1)
	file, err := os.ReadFile(filepath.Join(dir, "logs", "tx-e2e", "task93.93.1.log"))
	require.NoError(t, err)
	assert.Equal(t, string(file[:1000]), string(data), "the head is kept")
	f.mu.Lock()
	assert.Equal(t, int64(len(file)), f.logs.size[logKey{93, 1}], "the server knows the whole length")
	f.mu.Unlock()
	var sent int
	for _, p := range posts {
		sent += p.n
	}
	assert.LessOrEqual(t, sent, daemon.LogChunkBytes+1000, "the bytes past the cap are not all sent")
}

// TestLogWithResult: when the API asks for it, a short run's log rides on
// its result (no log request of its own) and is not kept in the agent's
// record; a long one goes in log requests first, as does the log of a
// stored result reported again.
func TestLogWithResult(t *testing.T) {
	f := newFakeAPI(t)
	dir := t.TempDir()
	start(t, testConfig(t, f, dir))

	short := work(95, 1, `echo hello; echo oops >&2`)
	short.LogWithResult = true
	long := work(96, 1, fmt.Sprintf(`head -c %d /dev/zero | tr '\0' x; echo`, protocol.MaxLogWithResult+10))
	long.LogWithResult = true
	f.push(short, long)
	res := f.waitResults(t, 95, 1)[0]
	data, posts := f.shippedLog(95, 1)
	file, err := os.ReadFile(filepath.Join(dir, "logs", "tx-e2e", "task95.95.1.log"))
	require.NoError(t, err)
	assert.Equal(t, string(file), string(data), "the whole log, byte for byte, with the result")
	assert.Contains(t, string(data), "out| hello\n")
	assert.Contains(t, string(data), "# finished ")
	assert.Empty(t, posts, "no log request for a short log")
	f.mu.Lock()
	assert.Equal(t, 1, f.logs.withResult[logKey{95, 1}])
	f.mu.Unlock()
	rec, err := (&daemon.Records{Dir: filepath.Join(dir, daemon.RecordsDir)}).LoadRun(95, 1)
	require.NoError(t, err)
	require.NotNil(t, rec.Result)
	assert.Nil(t, rec.Result.Log, "the record keeps the outcome, not the log")

	f.waitResults(t, 96, 1)
	data, posts = f.shippedLog(96, 1)
	file, err = os.ReadFile(filepath.Join(dir, "logs", "tx-e2e", "task96.96.1.log"))
	require.NoError(t, err)
	assert.Equal(t, len(file), len(data), "the whole long log")
	assert.NotEmpty(t, posts, "a long log goes in log requests")
	f.mu.Lock()
	assert.Zero(t, f.logs.withResult[logKey{96, 1}], "and the result carries none of it")
	f.mu.Unlock()

	// Offered again: the stored result is reported again, and its log goes
	// in a log request (idempotent by offset: nothing stored twice).
	f.push(short)
	again := f.waitResults(t, 95, 2)[1]
	assert.Equal(t, res, again)
	data, posts = f.shippedLog(95, 1)
	assert.Len(t, posts, 1)
	first, _ := os.ReadFile(filepath.Join(dir, "logs", "tx-e2e", "task95.95.1.log"))
	assert.Equal(t, string(first), string(data), "stored once")
}

// TestLogWithResultRefused: a report refused because of the log it carries
// (an API replica that does not take it, a body past its limit) loses
// neither: the log goes in log requests, then the result again without it.
func TestLogWithResultRefused(t *testing.T) {
	for _, status := range []int{http.StatusBadRequest, http.StatusRequestEntityTooLarge} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			f := newFakeAPI(t)
			f.refuseResultLog = status
			dir := t.TempDir()
			start(t, testConfig(t, f, dir))
			item := work(97, 1, `echo hello`)
			item.LogWithResult = true
			f.push(item)
			res := f.waitResults(t, 97, 1)[0]
			assert.True(t, res.Succeeded())
			assert.Equal(t, "hello\n", res.StdoutTail)
			data, posts := f.shippedLog(97, 1)
			file, err := os.ReadFile(filepath.Join(dir, "logs", "tx-e2e", "task97.97.1.log"))
			require.NoError(t, err)
			assert.Equal(t, string(file), string(data), "the whole log, in log requests")
			assert.NotEmpty(t, posts)
			f.mu.Lock()
			assert.Equal(t, 2, f.resultPosts[97], "refused with the log, then taken without it")
			assert.Zero(t, f.logs.withResult[logKey{97, 1}])
			f.mu.Unlock()
		})
	}
}

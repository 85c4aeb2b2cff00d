package web_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/anneal-dev/anneal/dev/testenv"
	"github.com/anneal-dev/anneal/models"
)

// dashRelease has a graph of a few seconds over two nodes, with a
// dependency across them, so that a timeline has something to show.
const dashRelease = `
name: dash
version: "1"
roles_metadata:
  controller: {tags: [database, api]}
  compute: {tags: [hypervisor]}
graphs:
  deployment:
    tasks:
      - id: prepare
        tags: ["/.*/"]
        parameters: {cmd: "sleep 1; echo prepared $ANNEAL_NODE", timeout: 30}
      - id: database
        tags: [database]
        requires: [prepare]
        parameters: {cmd: "sleep 1; echo database ready", timeout: 30}
      - id: api
        tags: [api]
        requires: [database]
        parameters: {cmd: "sleep 1; echo api up; echo a warning >&2", timeout: 30}
      - id: hypervisor
        tags: [hypervisor]
        requires: [prepare]
        cross_depends: [{name: api, tags: [api]}]
        parameters: {cmd: "sleep 0.5; echo joined", timeout: 30}
      - id: finish
        tags: ["/.*/"]
        requires: [api, hypervisor]
        parameters: {cmd: "echo done", timeout: 30}
`

// moduleRoot is the directory holding go.mod, for the screenshots.
func moduleRoot(t *testing.T) string {
	dir, err := os.Getwd()
	require.NoError(t, err)
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		require.NotEqual(t, parent, dir, "no go.mod above the test")
		dir = parent
	}
}

// browser starts a headless Chromium for one test, with a fresh profile;
// JavaScript exceptions of the page are collected.
func browser(t *testing.T) (context.Context, func() []string) {
	path := testenv.Chromium(t)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(path),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1400, 900),
	)
	var mu sync.Mutex
	var exceptions []string
	ctx, cancelCtx := chromedp.NewContext(alloc, chromedp.WithLogf(t.Logf), chromedp.WithListener(func(ev any) {
		if e, ok := ev.(*runtime.EventExceptionThrown); ok && e.ExceptionDetails != nil {
			text := e.ExceptionDetails.Text
			if e.ExceptionDetails.Exception != nil {
				text += " " + e.ExceptionDetails.Exception.Description
			}
			mu.Lock()
			exceptions = append(exceptions, fmt.Sprintf("%s:%d: %s", e.ExceptionDetails.URL, e.ExceptionDetails.LineNumber+1, text))
			mu.Unlock()
		}
	}))
	t.Cleanup(func() { cancelCtx(); cancelAlloc() })
	require.NoError(t, chromedp.Do(ctx), "start Chromium (%s)", path)
	return ctx, func() []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), exceptions...) }
}

// do runs browser steps.
func do(t *testing.T, ctx context.Context, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	require.NoError(t, chromedp.Do(ctx, steps...))
}

// waitJS waits until the expression is truthy in the page.
func waitJS(t *testing.T, ctx context.Context, what, expr string, within time.Duration) {
	t.Helper()
	_, err := chromedp.Run(ctx, chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(within), chromedp.WithPollingInterval(100*time.Millisecond)))
	if err != nil {
		body, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText`))
		t.Fatalf("%s: %v\npage text:\n%s", what, err, body)
	}
}

func evalJS[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	out, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	require.NoError(t, err, expr)
	return out
}

func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	dir := filepath.Join(moduleRoot(t), ".dev", "screenshots")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	path := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(path, png, 0o644))
	t.Logf("screenshot: %s", path)
}

// goTo moves the page to another dashboard page as a link does (a new
// hash, no reload).
func goTo(t *testing.T, ctx context.Context, hash string) {
	t.Helper()
	evalJS[any](t, ctx, fmt.Sprintf("location.hash = %q, 1", hash))
}

func signIn(t *testing.T, ctx context.Context, token string) {
	t.Helper()
	goTo(t, ctx, "#/signin")
	do(t, ctx,
		chromedp.WaitVisible(chromedp.CSS(`#token`)),
		chromedp.SendKeys(chromedp.CSS(`#token`), token),
		chromedp.Click(chromedp.CSS(`#signin button[type=submit]`)),
	)
	waitJS(t, ctx, "signed in", `document.querySelector('#scope') !== null`, 20*time.Second)
}

// TestDashboard drives the dashboard in a real headless Chromium: sign in
// with a token and see the deployments and their nodes; a transaction
// started through the API shows up in the live list, and its timeline turns
// green without reloading; a run's output, the task graph and the noderole
// page render; API errors are shown; a viewer token sees the pages with no
// action buttons, and the API refuses its actions with a 403 shown. The
// screenshots land in .dev/screenshots for review.
func TestDashboard(t *testing.T) {
	st := testenv.NewStack(t, testenv.Options{TemporalUI: "http://127.0.0.1:8233"})
	status, body := testenv.Call(t, http.MethodPost, st.URL+"/api/v1/releases", st.AdminToken, testenv.YAML(dashRelease), nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	status, body = st.Do(t, http.MethodPost, "/api/v1/deployments", map[string]string{"name": "web", "release": "dash"}, nil)
	require.Equal(t, http.StatusCreated, status, "%s", body)
	for short, roles := range map[string][]string{"ctl": {"controller"}, "cmp-1": {"compute"}, "cmp-2": {"compute"}} {
		st.StartAgent(t, nodeName(short))
		status, body := st.Do(t, http.MethodPatch, "/api/v1/nodes/"+nodeName(short), map[string]any{"deployment": "web", "roles": roles}, nil)
		require.Equal(t, http.StatusOK, status, "%s", body)
	}
	var dep models.Deployment
	st.Do(t, http.MethodGet, "/api/v1/deployments/web", nil, &dep)
	viewer, err := st.Store.CreateAPIToken(context.Background(), "dash-viewer", models.ScopeViewer)
	require.NoError(t, err)

	ctx, exceptions := browser(t)

	// Without a token: the sign-in page, not a blank one.
	do(t, ctx, chromedp.Navigate(st.URL+"/"))
	waitJS(t, ctx, "the sign-in page", `document.querySelector('#signin') !== null`, 20*time.Second)
	// A wrong token is refused with the API's message.
	do(t, ctx, chromedp.SendKeys(chromedp.CSS(`#token`), "ann_wrong"), chromedp.Click(chromedp.CSS(`#signin button[type=submit]`)))
	waitJS(t, ctx, "a refused sign-in", `document.querySelector('#signin .error-box')?.innerText.includes('unknown or revoked token')`, 20*time.Second)

	// Deployments and their nodes.
	signIn(t, ctx, st.AdminToken)
	waitJS(t, ctx, "the deployment's nodes", `document.querySelectorAll('section.deployment[data-deployment="web"] tr[data-node]').length === 3`, 20*time.Second)
	row := evalJS[string](t, ctx, `document.querySelector('tr[data-node="ctl.anneal.test"]').innerText`)
	assert.Contains(t, row, "controller")
	assert.Contains(t, row, "yes", "the node is alive")
	assert.Contains(t, row, "discover")
	assert.True(t, evalJS[bool](t, ctx, `document.querySelector('section[data-deployment="web"] button[data-action="deploy"]') !== null`), "an admin sees Deploy")
	assert.Equal(t, "admin", evalJS[string](t, ctx, `document.querySelector('#scope').dataset.scope`))
	screenshot(t, ctx, "dashboard-deployments.png")

	// The live list of transactions: one started through the API shows up
	// without reloading.
	goTo(t, ctx, "#/transactions")
	waitJS(t, ctx, "the transactions page", `document.querySelector('#live.on') !== null && document.querySelector('h1')?.innerText.startsWith('Transactions')`, 20*time.Second)
	evalJS[any](t, ctx, `window.sameDocument = 42`)
	tx := execute(t, st, map[string]any{"deployment": "web", "graphs": []map[string]any{{"type": "deployment"}}})
	waitJS(t, ctx, "the new transaction in the list", fmt.Sprintf(`document.querySelector('tr[data-tx="%s"]') !== null`, tx.TaskUUID), 20*time.Second)

	// Its timeline, from the list: bars turn green live.
	do(t, ctx, chromedp.Click(chromedp.CSS(fmt.Sprintf(`tr[data-tx="%s"] a`, tx.TaskUUID))))
	waitJS(t, ctx, "the timeline", `document.querySelectorAll('.timeline .run').length === 10`, 20*time.Second)
	early := evalJS[[]string](t, ctx, `[...document.querySelectorAll('.timeline .run')].map(e => e.dataset.state)`)
	assert.Contains(t, early, "pending", "the page opened before the runs finished: %v", early)
	waitJS(t, ctx, "a running bar", `document.querySelector('.timeline .tl-lane .run') !== null`, 30*time.Second)
	screenshot(t, ctx, "dashboard-transaction-running.png")
	waitJS(t, ctx, "every bar succeeded, live",
		`[...document.querySelectorAll('.timeline .run')].every(e => e.dataset.state === 'succeeded') && document.querySelectorAll('.timeline .tl-lane .run.s-succeeded').length === 10 && document.querySelector('#tx-status')?.dataset.status === 'ready'`, 60*time.Second)
	assert.Equal(t, 42, evalJS[int](t, ctx, `window.sameDocument`), "the page was not reloaded")
	rows := evalJS[[]string](t, ctx, `[...document.querySelectorAll('.tl-row')].map(e => e.dataset.node)`)
	assert.Equal(t, []string{nodeName("cmp-1"), nodeName("cmp-2"), nodeName("ctl")}, rows, "one row per node")
	color := evalJS[string](t, ctx, `getComputedStyle(document.querySelector('.tl-lane .run')).backgroundColor`)
	assert.Equal(t, "rgb(31, 157, 85)", color, "the succeeded colour")
	assert.True(t, evalJS[bool](t, ctx, `[...document.querySelectorAll('a')].some(a => a.href.startsWith('http://127.0.0.1:8233/namespaces/default/workflows/tx-'))`), "a link into the Temporal Web UI")
	assert.False(t, evalJS[bool](t, ctx, `document.querySelector('button[data-action="stop"]') !== null`), "no Stop on a finished transaction")
	screenshot(t, ctx, "dashboard-transaction.png")

	// A run's output: the full log where the server has one, else its tails.
	do(t, ctx, chromedp.Click(chromedp.CSS(`.tl-row[data-node="ctl.anneal.test"] .run[data-task="api"]`)))
	waitJS(t, ctx, "the run's output", `document.querySelector('#log')?.innerText.includes('api up') && document.querySelector('#log').innerText.includes('a warning')`, 20*time.Second)
	screenshot(t, ctx, "dashboard-log.png")

	// The deployment's task graph, drawn.
	goTo(t, ctx, fmt.Sprintf("#/deployments/%d/graph/deployment", dep.ID))
	waitJS(t, ctx, "the task graph", `document.querySelectorAll('svg.graph g.gnode').length === 5 && document.querySelectorAll('svg.graph path.edge').length === 6`, 20*time.Second)
	screenshot(t, ctx, "dashboard-graph.png")

	// The noderole page renders (this deployment has none bound).
	goTo(t, ctx, fmt.Sprintf("#/deployments/%d/noderoles", dep.ID))
	waitJS(t, ctx, "the noderole page", `document.querySelector('h1')?.innerText === 'Noderoles of web'`, 20*time.Second)

	// API errors are shown, with the envelope's message.
	goTo(t, ctx, "#/tx/00000000-0000-4000-8000-000000000000")
	waitJS(t, ctx, "a 404 shown", `document.querySelector('.error-box')?.innerText.includes('(404 not_found)')`, 20*time.Second)
	msg := evalJS[string](t, ctx, `document.querySelector('.error-box').innerText`)
	assert.Contains(t, msg, "00000000-0000-4000-8000-000000000000")
	goTo(t, ctx, "#/nowhere")
	waitJS(t, ctx, "an unknown page shown as such", `document.querySelector('.error-box')?.innerText.includes('no dashboard page')`, 20*time.Second)

	// A viewer sees everything and can act on nothing.
	do(t, ctx, chromedp.Click(chromedp.CSS(`#who button`)))
	waitJS(t, ctx, "signed out", `document.querySelector('#signin') !== null`, 20*time.Second)
	signIn(t, ctx, viewer)
	waitJS(t, ctx, "the viewer's deployments", `document.querySelectorAll('section.deployment[data-deployment="web"] tr[data-node]').length === 3`, 20*time.Second)
	assert.Equal(t, "viewer", evalJS[string](t, ctx, `document.querySelector('#scope').dataset.scope`))
	assert.False(t, evalJS[bool](t, ctx, `document.querySelector('button[data-action]') !== null`), "no action buttons for a viewer")
	second := execute(t, st, map[string]any{"deployment": "web", "graphs": []map[string]any{{"type": "deployment", "tasks": []string{"prepare"}}}})
	goTo(t, ctx, "#/tx/"+second.TaskUUID)
	waitJS(t, ctx, "the viewer's timeline", `document.querySelectorAll('.timeline .run').length === 3`, 20*time.Second)
	assert.False(t, evalJS[bool](t, ctx, `document.querySelector('button[data-action]') !== null`), "no Stop or Retry for a viewer")
	// Were it to act, the API's refusal is what the page shows.
	evalJS[any](t, ctx, fmt.Sprintf(`api('POST', '/transactions/%s/stop').catch(e => showError(e, 'Stop')), 1`, second.TaskUUID))
	waitJS(t, ctx, "the API's 403 shown", `!document.querySelector('#error').hidden && document.querySelector('#error').innerText.includes('403 forbidden')`, 10*time.Second)
	assert.Contains(t, evalJS[string](t, ctx, `document.querySelector('#error').innerText`), "needs a token of scope operator or admin")
	waitDone(t, st, second.TaskUUID, 60*time.Second)

	assert.Empty(t, exceptions(), "JavaScript exceptions in the page")
	for _, e := range exceptions() {
		t.Log(strings.TrimSpace(e))
	}
}

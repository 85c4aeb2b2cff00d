// anneal dashboard: a small single-page script over the JSON API and the
// live event stream. No framework, no build step: it is embedded in the
// server binary as is. Pages are addressed by the URL's hash:
//   #/                                  deployments and their nodes
//   #/transactions                      transactions, live
//   #/tx/<uuid>                         a transaction's timeline, live
//   #/tx/<uuid>/runs/<id>               a run's log, live
//   #/deployments/<id>/graph/<type>     a deployment's task graph, drawn
//   #/deployments/<id>/noderoles        a snapshot's noderole graph with states
//   #/signin                            sign in with a token
'use strict';

const TOKEN_KEY = 'anneal.token';
const RUN_STATES = ['planned', 'pending', 'running', 'succeeded', 'failed', 'blocked', 'skipped', 'cancelled'];
const FINISHED_TX = ['ready', 'error', 'stopped'];

const state = { me: null, page: null };

// ---------------------------------------------------------------- helpers

// h builds an element: h('a', {href: '#/'}, 'text', child, ...). Text is
// always set as text, never as HTML.
function h(tag, attrs, ...children) {
  const el = tag.startsWith('svg:')
    ? document.createElementNS('http://www.w3.org/2000/svg', tag.slice(4))
    : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.setAttribute('class', v);
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

// fill replaces an element's children (arrays flattened, null and false
// skipped, as h does).
function fill(el, ...children) {
  el.replaceChildren(...children.flat(Infinity).filter((c) => c !== undefined && c !== null && c !== false));
  return el;
}

function svg(tag, attrs, ...children) { return h('svg:' + tag, attrs, ...children); }

function token() { return sessionStorage.getItem(TOKEN_KEY) || localStorage.getItem(TOKEN_KEY) || ''; }

function canOperate() { return state.me && (state.me.scope === 'operator' || state.me.scope === 'admin'); }

function fmtTime(s) { return s ? new Date(s).toLocaleString() : '—'; }

function fmtDur(ms) {
  if (ms < 0 || !isFinite(ms)) return '';
  if (ms < 10000) return (ms / 1000).toFixed(1).replace(/\.0$/, '') + 's';
  const s = Math.round(ms / 1000);
  if (s < 60) return s + 's';
  if (s < 3600) return Math.floor(s / 60) + 'm' + String(s % 60).padStart(2, '0') + 's';
  return Math.floor(s / 3600) + 'h' + String(Math.floor(s / 60) % 60).padStart(2, '0') + 'm';
}

function badge(s) { return h('span', { class: 'badge s-' + s, dataset: { state: s } }, s); }

function progressBar(p) {
  const fill = h('span');
  fill.style.width = Math.max(0, Math.min(100, p || 0)) + '%';
  return h('span', {}, h('span', { class: 'progress' }, fill), (p || 0) + '%');
}

function debounce(fn, ms) {
  let t = null;
  return () => { clearTimeout(t); t = setTimeout(fn, ms); };
}

// ApiError is an answer of the API that is not a success: its envelope's
// message, code and status.
class ApiError extends Error {
  constructor(status, code, message) { super(message); this.status = status; this.code = code; }
}

// api calls the API with the signed-in token and returns the decoded
// answer; an error answer throws an ApiError with the envelope's message.
async function api(method, path, body) {
  const headers = { Authorization: 'Bearer ' + token() };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  let res;
  try {
    res = await fetch('/api/v1' + path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (e) {
    throw new ApiError(0, 'network', 'cannot reach the anneal API: ' + e.message);
  }
  const text = await res.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (e) { data = null; }
  if (!res.ok) {
    const err = data && data.error;
    throw new ApiError(res.status, err ? err.code : 'http_' + res.status,
      err ? err.message : `${res.status} ${res.statusText}: ${text.slice(0, 200)}`);
  }
  return data;
}

// listAll reads every page of a list (up to `max` items).
async function listAll(path, max = 20000) {
  const items = [];
  let cursor = '';
  const sep = path.includes('?') ? '&' : '?';
  do {
    const page = await api('GET', `${path}${sep}limit=1000${cursor ? '&cursor=' + encodeURIComponent(cursor) : ''}`);
    items.push(...page.items);
    cursor = page.next_cursor;
  } while (cursor && items.length < max);
  return items;
}

// showError puts an error in the banner (an ApiError's message as the API
// gave it); null clears it.
function showError(err, what) {
  const box = document.getElementById('error');
  fill(box);
  if (!err) { box.hidden = true; return; }
  box.hidden = false;
  box.append(h('strong', {}, what ? what + ': ' : 'Error: '), err.message || String(err));
  if (err.status) box.append(' ', h('span', { class: 'code' }, `(${err.status} ${err.code})`));
  box.append(' ', h('button', { class: 'secondary', onclick: () => showError(null) }, 'dismiss'));
}

function errorBox(err, what) {
  return h('div', { class: 'error-box', role: 'alert' }, h('strong', {}, (what || 'Error') + ': '), err.message || String(err),
    err.status ? h('span', { class: 'code' }, ` (${err.status} ${err.code})`) : null);
}

// action runs an operator action from a button, showing the API's answer
// (a 403 for a token that may not) in the banner.
function actionButton(label, cls, run) {
  const b = h('button', { class: cls || '', dataset: { action: label.toLowerCase() } }, label);
  b.addEventListener('click', async () => {
    b.disabled = true;
    try { showError(null); await run(); } catch (e) { showError(e, label); } finally { b.disabled = false; }
  });
  return b;
}

// -------------------------------------------------------- the event stream

// EventStream reads GET /api/v1/events with fetch (an EventSource cannot
// send the bearer token), parses server-sent events and reconnects with the
// last event id after the server's retry delay.
class EventStream {
  constructor(query, onEvent) {
    this.query = query; this.onEvent = onEvent; this.lastId = ''; this.retry = 2000;
    this.ctrl = new AbortController(); this.closed = false;
    this.run();
  }
  close() { this.closed = true; this.ctrl.abort(); setLive(false); }
  async run() {
    while (!this.closed) {
      try {
        const headers = { Authorization: 'Bearer ' + token() };
        if (this.lastId) headers['Last-Event-ID'] = this.lastId;
        const res = await fetch('/api/v1/events' + (this.query ? '?' + this.query : ''), { headers, signal: this.ctrl.signal });
        if (!res.ok) {
          let msg = res.statusText;
          try { msg = (await res.json()).error.message; } catch (e) { /* keep the status text */ }
          showError(new ApiError(res.status, 'events', msg), 'Live updates');
          if (res.status === 401 || res.status === 403 || res.status === 404) { setLive(false); return; }
        } else {
          setLive(true);
          await this.read(res.body.getReader());
        }
      } catch (e) {
        if (this.closed) return;
      }
      setLive(false);
      await new Promise((r) => setTimeout(r, this.retry));
    }
  }
  async read(reader) {
    const dec = new TextDecoder();
    let buf = '';
    let ev = { event: 'message', data: [], id: null };
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buf += dec.decode(value, { stream: true });
      let nl;
      while ((nl = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, nl).replace(/\r$/, '');
        buf = buf.slice(nl + 1);
        if (line === '') {
          if (ev.id !== null) this.lastId = ev.id;
          if (ev.data.length) {
            try { this.onEvent(ev.event, JSON.parse(ev.data.join('\n'))); } catch (e) { console.error('event', e); }
          }
          ev = { event: 'message', data: [], id: null };
          continue;
        }
        if (line.startsWith(':')) continue;
        const i = line.indexOf(':');
        const field = i < 0 ? line : line.slice(0, i);
        const val = i < 0 ? '' : line.slice(i + 1).replace(/^ /, '');
        if (field === 'data') ev.data.push(val);
        else if (field === 'event') ev.event = val;
        else if (field === 'id') ev.id = val;
        else if (field === 'retry' && /^\d+$/.test(val)) this.retry = Number(val);
      }
    }
  }
}

function setLive(on) {
  const el = document.getElementById('live');
  el.className = 'live ' + (on ? 'on' : 'off');
  el.textContent = on ? 'live' : 'offline';
}

// ------------------------------------------------------------------ pages

// Page is what a route renders: it owns a container, its event stream and
// its timers, all dropped when the user navigates away.
class Page {
  constructor() { this.el = h('div'); this.stream = null; this.timers = []; this.gone = false; this.ctrl = new AbortController(); }
  listen(query, onEvent) { this.stream = new EventStream(query, (kind, e) => { if (!this.gone) onEvent(kind, e); }); }
  every(ms, fn) { this.timers.push(setInterval(() => { if (!this.gone) fn(); }, ms)); }
  dispose() { this.gone = true; this.ctrl.abort(); if (this.stream) this.stream.close(); this.timers.forEach(clearInterval); }
}

async function deploymentsPage(page) {
  const el = page.el;
  const draw = async () => {
    const deps = await listAll('/deployments');
    const nodes = await listAll('/nodes');
    const byDep = {};
    for (const n of nodes) (byDep[n.deployment_id] = byDep[n.deployment_id] || []).push(n);
    const cards = deps.map((d) => {
      const ns = byDep[d.id] || [];
      const head = h('div', { class: 'card-head' }, h('h2', {}, d.name), h('span', { class: 'muted' }, `${ns.length} node${ns.length === 1 ? '' : 's'}`),
        h('span', { class: 'spacer' }),
        h('a', { href: `#/transactions?deployment=${encodeURIComponent(d.name)}` }, 'transactions'),
        h('a', { href: `#/deployments/${d.id}/graph/deployment` }, 'task graph'),
        h('a', { href: `#/deployments/${d.id}/noderoles` }, 'noderoles'),
        canOperate() && d.release_id ? actionButton('Deploy', '', async () => {
          const tx = await api('POST', '/graphs/execute', { deployment: d.name, graphs: [{ type: 'deployment' }] });
          location.hash = '#/tx/' + tx.task_uuid;
        }) : null);
      const table = ns.length === 0 ? h('p', { class: 'muted' }, 'No nodes.') : h('table', { class: 'nodes' },
        h('thead', {}, h('tr', {}, ['Node', 'Status', 'Progress', 'Alive', 'Roles', 'Last seen'].map((t) => h('th', {}, t)))),
        h('tbody', {}, ns.map((n) => h('tr', { dataset: { node: n.name } },
          h('td', {}, n.name, n.admin ? h('span', { class: 'muted' }, ' (admin)') : null),
          h('td', {}, badge(n.computed_status || n.status), n.error_type ? h('span', { class: 'muted' }, ' ' + n.error_type) : null),
          h('td', {}, progressBar(n.progress)),
          h('td', {}, h('span', { class: 'dot' + (n.alive ? ' alive' : '') }), n.alive ? 'yes' : 'no'),
          h('td', {}, (n.roles || []).map((r) => h('span', { class: 'role' }, r))),
          h('td', { class: 'muted' }, fmtTime(n.last_seen_at))))));
      return h('section', { class: 'card deployment', dataset: { deployment: d.name } }, head, table);
    });
    fill(el, h('h1', {}, 'Deployments'), cards.length ? cards : h('p', { class: 'muted' }, 'No deployments yet.'));
  };
  await draw();
  const again = debounce(() => draw().catch((e) => showError(e, 'Refresh')), 400);
  page.listen('', (kind) => { if (kind === 'node' || kind === 'resync') again(); });
}

async function transactionsPage(page, params) {
  const el = page.el;
  const dep = params.get('deployment') || '';
  const draw = async () => {
    const q = dep ? '?deployment=' + encodeURIComponent(dep) + '&limit=100' : '?limit=100';
    const list = await api('GET', '/transactions' + q);
    const rows = list.items.map((t) => h('tr', { dataset: { tx: t.uuid, status: t.status } },
      h('td', {}, h('a', { href: '#/tx/' + t.uuid }, t.uuid.slice(0, 8))),
      h('td', {}, t.deployment),
      h('td', {}, (t.graphs || []).map((g) => g.type).join(', ')),
      h('td', {}, badge(t.status)),
      h('td', {}, progressBar(t.progress)),
      h('td', { class: 'muted' }, fmtTime(t.created_at)),
      h('td', {}, t.finished_at && t.started_at ? fmtDur(new Date(t.finished_at) - new Date(t.started_at)) : ''),
      h('td', {}, t.links && t.links.temporal_ui ? h('a', { href: t.links.temporal_ui, target: '_blank', rel: 'noopener' }, 'Temporal') : '')));
    fill(el, h('h1', {}, 'Transactions', dep ? ` of ${dep}` : ''),
      h('div', { class: 'card' }, rows.length === 0 ? h('p', { class: 'muted' }, 'No transactions yet.') : h('table', { class: 'transactions' },
        h('thead', {}, h('tr', {}, ['Transaction', 'Deployment', 'Graphs', 'Status', 'Progress', 'Created', 'Took', ''].map((t) => h('th', {}, t)))),
        h('tbody', {}, rows))));
  };
  await draw();
  const again = debounce(() => draw().catch((e) => showError(e, 'Refresh')), 500);
  page.listen(dep ? 'deployment=' + encodeURIComponent(dep) : '',
    (kind) => { if (kind === 'transaction' || kind === 'run' || kind === 'runs' || kind === 'resync') again(); });
}

// transactionPage draws the timeline: one row per node, its runs as bars
// placed by their start and end times and coloured by state; runs that have
// not started wait as small squares at the row's end. Run events recolour a
// bar at once; the rows are then read again for the times.
async function transactionPage(page, uuid) {
  const el = page.el;
  let tx = null;
  let runs = [];
  const header = h('div');
  const timeline = h('div', { class: 'card timeline' });
  fill(el, header, timeline);

  const load = async () => {
    [tx, runs] = await Promise.all([api('GET', '/transactions/' + uuid), listAll(`/transactions/${uuid}/runs`)]);
    drawHeader();
    drawTimeline();
  };
  const drawHeader = () => {
    const actions = [];
    if (canOperate()) {
      if (!FINISHED_TX.includes(tx.status)) actions.push(actionButton('Stop', 'danger', async () => { await api('POST', `/transactions/${uuid}/stop`); await load(); }));
      if (tx.status === 'error' || tx.status === 'stopped') actions.push(actionButton('Retry', '', async () => { await api('POST', `/transactions/${uuid}/retry`); await load(); }));
    }
    fill(header,
      h('h1', {}, 'Transaction ', h('code', {}, uuid)),
      h('div', { class: 'card' },
        h('div', { class: 'card-head' }, badge(tx.status), h('span', { id: 'tx-status', dataset: { status: tx.status } }, progressBar(tx.progress)),
          h('span', { class: 'muted' }, 'deployment ', h('a', { href: `#/transactions?deployment=${encodeURIComponent(tx.deployment)}` }, tx.deployment)),
          h('span', { class: 'muted' }, (tx.graphs || []).map((g) => g.type).join(', ')),
          tx.dry_run ? h('span', { class: 'badge' }, 'dry run') : null,
          h('span', { class: 'spacer' }),
          tx.links && tx.links.temporal_ui ? h('a', { href: tx.links.temporal_ui, target: '_blank', rel: 'noopener' }, 'Temporal UI ↗') : null,
          actions),
        h('div', { class: 'counts muted' }, 'created ', fmtTime(tx.created_at), ' · started ', fmtTime(tx.started_at), ' · finished ', fmtTime(tx.finished_at)),
        h('div', { class: 'counts' }, Object.entries(tx.counts || {}).map(([k, v]) => h('span', {}, badge(k), ' ', v))),
        tx.error ? h('div', { class: 'error-box' }, tx.error) : null,
        (tx.warnings || []).length ? h('div', { class: 'notice' }, tx.warnings.join('; ')) : null));
  };
  const drawTimeline = () => {
    const now = Date.now();
    const t = (s) => (s ? new Date(s).getTime() : null);
    let t0 = t(tx.started_at) || t(tx.created_at);
    let t1 = t(tx.finished_at) || now;
    for (const r of runs) {
      if (r.started_at) t0 = Math.min(t0, t(r.started_at));
      if (r.finished_at) t1 = Math.max(t1, t(r.finished_at));
    }
    const span = Math.max(t1 - t0, 1000);
    const rowsByNode = new Map();
    for (const r of runs) {
      const key = r.node_name || '(deleted node)';
      if (!rowsByNode.has(key)) rowsByNode.set(key, []);
      rowsByNode.get(key).push(r);
    }
    const ticks = [0, 0.25, 0.5, 0.75, 1].map((f) => {
      const s = h('span', {}, '+' + fmtDur(span * f));
      s.style.left = f * 100 + '%';
      return s;
    });
    const rows = [...rowsByNode.keys()].sort().map((node) => {
      const lane = h('div', { class: 'tl-lane' });
      const wait = h('div', { class: 'tl-wait' });
      for (const r of rowsByNode.get(node)) {
        const title = `${r.task_name} on ${node}: ${r.state}` + (r.attempt > 1 ? ` (attempt ${r.attempt})` : '') +
          (r.started_at ? `, ${fmtDur((t(r.finished_at) || now) - t(r.started_at))}` : '') + (r.error ? ` — ${r.error}` : '');
        const bar = h('a', { class: 'run s-' + r.state, href: `#/tx/${uuid}/runs/${r.id}`, title, dataset: { run: r.id, state: r.state, task: r.task_name } });
        if (r.started_at) {
          const a = t(r.started_at) - t0;
          const b = (t(r.finished_at) || (r.state === 'running' ? now : t(r.started_at))) - t0;
          bar.style.left = (a / span) * 100 + '%';
          bar.style.width = Math.max(((b - a) / span) * 100, 0.4) + '%';
          bar.textContent = r.task_name;
          lane.append(bar);
        } else {
          wait.append(bar);
        }
      }
      return h('div', { class: 'tl-row', dataset: { node } }, h('div', { class: 'tl-node', title: node }, node), lane, wait);
    });
    fill(timeline,
      h('div', { class: 'legend' }, RUN_STATES.map((s) => h('span', {}, h('i', { class: 'swatch s-' + s }), s))),
      h('div', { class: 'tl-axis' }, h('div', {}, 'node'), h('div', { class: 'ticks' }, ticks), h('div', {}, 'not started')),
      rows.length ? rows : h('p', { class: 'muted' }, tx.status === 'pending' ? 'Planning…' : 'No runs.'));
  };

  await load();
  const again = debounce(() => load().catch((e) => showError(e, 'Refresh')), 300);
  page.listen('deployment=' + tx.deployment_id, (kind, e) => {
    if (kind === 'run' && e.transaction === uuid) {
      // Recolour at once; the times follow with the next read.
      const r = runs.find((x) => x.id === e.id);
      if (r) r.state = e.state;
      for (const bar of timeline.querySelectorAll(`[data-run="${e.id}"]`)) {
        bar.className = 'run s-' + e.state;
        bar.dataset.state = e.state;
      }
      again();
    } else if ((kind === 'transaction' || kind === 'runs') && e.id === uuid) again();
    else if (kind === 'resync') again();
  });
  // Running bars grow with time.
  page.every(1000, () => { if (tx && !FINISHED_TX.includes(tx.status)) drawTimeline(); });
}

// runLogPage shows a run's log: the server's full log, followed live,
// when it has the log endpoint; else the output tails kept with the run,
// read again when the run changes.
async function runLogPage(page, uuid, runID) {
  const el = page.el;
  const info = h('div', { class: 'card' });
  const pre = h('pre', { class: 'log', id: 'log' });
  const note = h('div');
  fill(el, h('h1', {}, 'Run ', runID, ' of ', h('a', { href: '#/tx/' + uuid }, uuid.slice(0, 8))), info, note, pre);

  const readRun = async () => {
    const runs = await listAll(`/transactions/${uuid}/runs`);
    const r = runs.find((x) => String(x.id) === String(runID));
    if (!r) throw new ApiError(404, 'not_found', `transaction ${uuid} has no run ${runID}`);
    fill(info, h('div', { class: 'card-head' }, h('strong', {}, r.task_name), 'on', h('span', {}, r.node_name), badge(r.state),
      h('span', { class: 'muted' }, `attempt ${r.attempt}`), r.exit_code !== null && r.exit_code !== undefined ? h('span', { class: 'muted' }, `exit ${r.exit_code}`) : null,
      h('span', { class: 'muted' }, fmtTime(r.started_at), ' → ', fmtTime(r.finished_at))),
    r.error ? h('div', { class: 'error-box' }, r.error) : null);
    return r;
  };
  await readRun();

  // The full log, followed, where the server has it.
  let res = null;
  try {
    res = await fetch(`/api/v1/transactions/${uuid}/runs/${runID}/log?follow=1`, { headers: { Authorization: 'Bearer ' + token() }, signal: page.ctrl.signal });
  } catch (e) { res = null; }
  if (res && res.status === 200) {
    pre.dataset.source = 'log';
    const reader = res.body.getReader();
    const dec = new TextDecoder();
    const refresh = debounce(() => readRun().catch(() => {}), 300);
    page.listen('', (kind, e) => { if (kind === 'run' && String(e.id) === String(runID)) refresh(); });
    (async () => {
      for (;;) {
        let chunk;
        try { chunk = await reader.read(); } catch (e) { return; }
        if (chunk.done) return;
        const stick = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
        pre.append(dec.decode(chunk.value, { stream: true }));
        if (stick) pre.scrollTop = pre.scrollHeight;
      }
    })();
    return;
  }
  // The tails kept with the run.
  if (res) res.body && res.body.cancel().catch(() => {});
  pre.dataset.source = 'tail';
  fill(note, h('div', { class: 'notice' }, 'The full log is not available from this server' +
    (res ? ` (${res.status})` : '') + '; showing the output tails kept with the run, updated live.'));
  const drawTail = (r) => {
    fill(pre, r.stdout_tail || '', r.stderr_tail ? h('span', { class: 'stderr' }, r.stderr_tail) : '');
    if (!r.stdout_tail && !r.stderr_tail) pre.append(h('span', { class: 'muted' }, r.state === 'running' || r.state === 'pending' ? '(no output yet)' : '(no output)'));
  };
  drawTail(await readRun());
  const again = debounce(() => readRun().then(drawTail).catch((e) => showError(e, 'Refresh')), 300);
  page.listen('', (kind, e) => { if ((kind === 'run' && String(e.id) === String(runID)) || kind === 'resync') again(); });
}

// layered lays out a DAG left to right: each node's column is its longest
// path from a root (a cycle's remaining nodes go in a last column); rows in
// a column follow the order given. It returns {pos: id -> {x, y}, width,
// height}.
function layered(ids, edges, boxW, boxH) {
  const preds = new Map(ids.map((i) => [i, []]));
  const succs = new Map(ids.map((i) => [i, []]));
  for (const [a, b] of edges) { if (preds.has(a) && preds.has(b)) { preds.get(b).push(a); succs.get(a).push(b); } }
  const depth = new Map();
  const indeg = new Map(ids.map((i) => [i, preds.get(i).length]));
  const queue = ids.filter((i) => indeg.get(i) === 0);
  queue.forEach((i) => depth.set(i, 0));
  while (queue.length) {
    const a = queue.shift();
    for (const b of succs.get(a)) {
      depth.set(b, Math.max(depth.get(b) || 0, depth.get(a) + 1));
      indeg.set(b, indeg.get(b) - 1);
      if (indeg.get(b) === 0) queue.push(b);
    }
  }
  let maxD = Math.max(0, ...depth.values());
  const rest = ids.filter((i) => !depth.has(i));
  if (rest.length) { maxD += 1; rest.forEach((i) => depth.set(i, maxD)); }
  const cols = [];
  for (const i of ids) (cols[depth.get(i)] = cols[depth.get(i)] || []).push(i);
  // Order each column by the mean row of its parents, to cut crossings a bit.
  const row = new Map();
  cols.forEach((col, d) => {
    if (d > 0) {
      const key = (i) => { const p = preds.get(i).filter((x) => row.has(x)); return p.length ? p.reduce((s, x) => s + row.get(x), 0) / p.length : 1e9; };
      col.sort((a, b) => key(a) - key(b));
    }
    col.forEach((i, r) => row.set(i, r));
  });
  const gapX = 70, gapY = 18, pad = 16;
  const pos = new Map();
  cols.forEach((col, d) => col.forEach((i, r) => pos.set(i, { x: pad + d * (boxW + gapX), y: pad + r * (boxH + gapY) })));
  const tallest = Math.max(1, ...cols.map((c) => c.length));
  return { pos, width: pad * 2 + cols.length * (boxW + gapX) - gapX, height: pad * 2 + tallest * (boxH + gapY) - gapY };
}

// drawGraph renders boxes and edges as SVG. An edge between neighbouring
// columns is a curve between them; one that skips columns arcs above the
// boxes it passes, higher the farther it goes.
function drawGraph(nodes, edges, boxW, boxH) {
  const lay = layered(nodes.map((n) => n.id), edges.map((e) => [e.from, e.to]), boxW, boxH);
  const colOf = (p) => Math.round((p.x - 16) / (boxW + 70));
  let lift = 0;
  for (const e of edges) {
    const a = lay.pos.get(e.from), b = lay.pos.get(e.to);
    if (a && b && Math.abs(colOf(b) - colOf(a)) > 1) lift = Math.max(lift, Math.min(140, 22 * (Math.abs(colOf(b) - colOf(a)) - 1) + 18));
  }
  const pos = new Map([...lay.pos].map(([id, p]) => [id, { x: p.x, y: p.y + lift }]));
  const width = Math.max(lay.width, 200), height = Math.max(lay.height + lift, 60);
  const root = svg('svg', { class: 'graph', width, height, viewBox: `0 0 ${width} ${height}` });
  root.append(svg('defs', {}, svg('marker', { id: 'arrow', viewBox: '0 0 10 10', refX: 10, refY: 5, markerWidth: 7, markerHeight: 7, orient: 'auto-start-reverse' },
    svg('path', { d: 'M 0 0 L 10 5 L 0 10 z', fill: '#9aa3b2' }))));
  for (const e of edges) {
    const a = pos.get(e.from), b = pos.get(e.to);
    if (!a || !b) continue;
    const skip = colOf(b) - colOf(a);
    let d;
    if (skip > 1) {
      const x1 = a.x + boxW * 0.75, y1 = a.y, x2 = b.x + boxW * 0.25, y2 = b.y;
      const top = Math.min(y1, y2) - Math.min(140, 22 * (skip - 1) + 18);
      d = `M ${x1} ${y1} C ${x1} ${top}, ${x2} ${top}, ${x2} ${y2}`;
    } else {
      const x1 = a.x + boxW, y1 = a.y + boxH / 2, x2 = b.x, y2 = b.y + boxH / 2;
      const mx = (x1 + x2) / 2;
      d = `M ${x1} ${y1} C ${mx} ${y1}, ${mx} ${y2}, ${x2} ${y2}`;
    }
    root.append(svg('path', { class: 'edge' + (e.cross ? ' cross' : ''), d, 'marker-end': 'url(#arrow)' }, svg('title', {}, `${e.from} → ${e.to}`)));
  }
  for (const n of nodes) {
    const p = pos.get(n.id);
    const g = svg('g', { class: 'gnode', transform: `translate(${p.x},${p.y})`, 'data-id': n.id, 'data-state': n.state || '' },
      svg('title', {}, n.title || n.label),
      svg('rect', { width: boxW, height: boxH, rx: 5, fill: n.fill || '#eef2fb' }),
      svg('text', { x: 8, y: 17 }, clip(n.label, 26)),
      n.sub ? svg('text', { x: 8, y: 33, fill: '#5b6575' }, clip(n.sub, 28)) : null);
    if (n.href) {
      const link = svg('a', { href: n.href });
      if (n.href.startsWith('http')) { link.setAttribute('target', '_blank'); link.setAttribute('rel', 'noopener'); }
      link.append(g);
      root.append(link);
    } else root.append(g);
  }
  return root;
}

function clip(s, n) { return s && s.length > n ? s.slice(0, n - 1) + '…' : s; }

const TASK_FILL = { group: '#f1e9fb', stage: '#fbeee0', skipped: '#eef0f3', noop: '#eef0f3', reboot: '#fdecec' };

async function taskGraphPage(page, depID, type) {
  const el = page.el;
  const [dep, graphs, graph] = await Promise.all([api('GET', '/deployments/' + depID), api('GET', `/deployments/${depID}/graphs`),
    api('GET', `/deployments/${depID}/graphs/${encodeURIComponent(type)}/tasks`)]);
  const tasks = graph.tasks || [];
  const ids = new Set(tasks.map((t) => t.id));
  const edges = [];
  for (const t of tasks) {
    for (const r of t.requires || []) if (ids.has(r)) edges.push({ from: r, to: t.id });
    for (const r of t.required_for || []) if (ids.has(r)) edges.push({ from: t.id, to: r });
    for (const c of t.cross_depends || []) if (ids.has(c.name) && c.name !== t.id) edges.push({ from: c.name, to: t.id, cross: true });
  }
  const nodes = tasks.map((t) => ({ id: t.id, label: t.id, sub: [t.type || 'shell', (t.tags || []).join(',') || [].concat(t.role || []).join(',')].filter(Boolean).join(' · '),
    fill: TASK_FILL[t.type] || '#eef2fb', title: `${t.id} (${t.type || 'shell'})` + ((t.requires || []).length ? `\nrequires: ${t.requires.join(', ')}` : '') }));
  const select = h('select', { onchange: (e) => { location.hash = `#/deployments/${depID}/graph/${encodeURIComponent(e.target.value)}`; } },
    (graphs.available || []).map((g) => h('option', { value: g, selected: g === type }, g)));
  const dot = h('pre', { class: 'log', hidden: true });
  fill(el, h('h1', {}, `Task graph of ${dep.name}`),
    h('div', { class: 'toolbar' }, 'graph', select, h('span', { class: 'muted' }, `${tasks.length} tasks, ${edges.length} edges (dashed: across nodes)`),
      h('button', { class: 'secondary', onclick: async () => {
        try { dot.textContent = await (await fetch(`/api/v1/deployments/${depID}/graphs/${encodeURIComponent(type)}/graph.gv`, { headers: { Authorization: 'Bearer ' + token() } })).text(); dot.hidden = !dot.hidden; } catch (e) { showError(e, 'DOT'); }
      } }, 'DOT as planned')),
    tasks.length ? h('div', { class: 'graph-wrap' }, drawGraph(nodes, edges, 190, 42)) : h('p', { class: 'muted' }, 'This graph has no tasks.'), dot);
}

const NR_FILL = { proposed: '#eef0f3', todo: '#dfe3ea', blocked: '#fbe3bf', transition: '#cfe0fd', active: '#cdebd9', error: '#f8d0d0' };

async function nodeRolesPage(page, depID, params) {
  const el = page.el;
  const draw = async () => {
    const [dep, nrs] = await Promise.all([api('GET', '/deployments/' + depID), listAll('/noderoles?deployment=' + encodeURIComponent(depID))]);
    const snaps = [...new Set(nrs.map((n) => n.snapshot_id))].sort((a, b) => b - a);
    const snap = Number(params.get('snapshot')) || snaps[0];
    const shown = nrs.filter((n) => n.snapshot_id === snap);
    const ids = new Set(shown.map((n) => n.id));
    const edges = [];
    for (const n of shown) for (const p of n.parents || []) if (ids.has(p)) edges.push({ from: p, to: n.id });
    const nodes = shown.map((n) => ({ id: n.id, label: n.role, sub: `${n.node} · ${n.state}`, state: n.state, fill: NR_FILL[n.state] || '#eef2fb',
      title: `${n.role} on ${n.node}: ${n.state} (noderole ${n.id}, ${n.run_count} runs)`, href: n.links && n.links.temporal_ui }));
    const counts = {};
    shown.forEach((n) => { counts[n.state] = (counts[n.state] || 0) + 1; });
    fill(el, h('h1', {}, `Noderoles of ${dep.name}`),
      h('div', { class: 'toolbar' }, 'snapshot', h('select', { onchange: (e) => { location.hash = `#/deployments/${depID}/noderoles?snapshot=${e.target.value}`; } },
        snaps.map((s) => h('option', { value: s, selected: s === snap }, s))),
        h('span', { class: 'counts' }, Object.entries(counts).map(([k, v]) => h('span', {}, badge(k), ' ', v)))),
      shown.length ? h('div', { class: 'graph-wrap' }, drawGraph(nodes, edges, 210, 42)) : h('p', { class: 'muted' }, 'No noderoles in this deployment.'),
      h('div', { class: 'legend' }, Object.keys(NR_FILL).map((s) => { const i = h('i'); i.style.background = NR_FILL[s]; i.style.border = '1px solid #7a8495'; return h('span', {}, i, s); })));
  };
  await draw();
  const again = debounce(() => draw().catch((e) => showError(e, 'Refresh')), 400);
  page.listen('deployment=' + encodeURIComponent(depID), (kind) => { if (kind === 'noderole' || kind === 'noderoles' || kind === 'resync') again(); });
}

function signInPage(page, reason) {
  const input = h('input', { type: 'password', id: 'token', placeholder: 'ann_…', autocomplete: 'off', required: true });
  const remember = h('input', { type: 'checkbox', id: 'remember' });
  const msg = h('div');
  if (reason) msg.append(errorBox(reason, 'Sign in again'));
  const form = h('form', { class: 'card signin', id: 'signin' },
    h('h1', {}, 'Sign in to anneal'),
    h('p', { class: 'muted' }, 'Paste an API token (admin, operator or viewer). `go run ./dev up` writes one to .dev/env as ANNEAL_TOKEN.'),
    input, h('label', {}, remember, ' keep me signed in on this browser'), h('div', {}, h('button', { type: 'submit' }, 'Sign in')), msg);
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const secret = input.value.trim();
    sessionStorage.setItem(TOKEN_KEY, secret);
    localStorage.removeItem(TOKEN_KEY);
    try {
      state.me = await api('GET', '/whoami');
    } catch (e) {
      sessionStorage.removeItem(TOKEN_KEY);
      fill(msg, errorBox(e, 'Sign-in refused'));
      return;
    }
    if (remember.checked) localStorage.setItem(TOKEN_KEY, secret);
    drawWho();
    location.hash = '#/';
  });
  page.el.append(form);
  setTimeout(() => input.focus(), 0);
}

function signOut() {
  sessionStorage.removeItem(TOKEN_KEY);
  localStorage.removeItem(TOKEN_KEY);
  state.me = null;
  drawWho();
  location.hash = '#/signin';
}

function drawWho() {
  const who = document.getElementById('who');
  const tl = document.getElementById('temporal-link');
  if (!state.me) { fill(who); tl.hidden = true; return; }
  fill(who, h('span', { id: 'scope', dataset: { scope: state.me.scope } }, `${state.me.name} (${state.me.scope})`),
    h('button', { class: 'secondary', onclick: signOut }, 'Sign out'));
  const ui = state.me.links && state.me.links.temporal_ui;
  tl.hidden = !ui;
  if (ui) tl.href = ui;
}

// route renders the page the hash names, and an error box (never a blank
// page) when it cannot.
async function route() {
  if (state.page) state.page.dispose();
  const page = new Page();
  state.page = page;
  const app = document.getElementById('app');
  fill(app, page.el);
  showError(null);
  const [path, query] = (location.hash.replace(/^#/, '') || '/').split('?');
  const params = new URLSearchParams(query || '');
  const parts = path.split('/').filter(Boolean).map(decodeURIComponent);
  if (parts[0] === 'signin') return signInPage(page);
  if (!token()) return signInPage(page);
  page.el.append(h('p', { class: 'muted' }, 'Loading…'));
  try {
    if (!state.me) { state.me = await api('GET', '/whoami'); drawWho(); }
    if (parts.length === 0) await deploymentsPage(page);
    else if (parts[0] === 'transactions') await transactionsPage(page, params);
    else if (parts[0] === 'tx' && parts.length === 2) await transactionPage(page, parts[1]);
    else if (parts[0] === 'tx' && parts[2] === 'runs' && parts.length === 4) await runLogPage(page, parts[1], parts[3]);
    else if (parts[0] === 'deployments' && parts[2] === 'graph') await taskGraphPage(page, parts[1], parts[3] || 'deployment');
    else if (parts[0] === 'deployments' && parts[2] === 'noderoles') await nodeRolesPage(page, parts[1], params);
    else throw new ApiError(404, 'not_found', `no dashboard page at #${path}`);
  } catch (e) {
    if (page.gone) return;
    if (e.status === 401) {
      sessionStorage.removeItem(TOKEN_KEY); localStorage.removeItem(TOKEN_KEY); state.me = null; drawWho();
      fill(page.el);
      return signInPage(page, e);
    }
    fill(page.el, errorBox(e, 'Cannot show this page'), h('p', {}, h('a', { href: '#/' }, 'Back to the deployments')));
  }
}

window.addEventListener('hashchange', route);
window.addEventListener('error', (e) => showError(e.error || new Error(e.message), 'Dashboard'));
window.addEventListener('unhandledrejection', (e) => showError(e.reason, 'Dashboard'));
route();

// Kumiko admin page: polls GET /api/admin/consumers every 2 seconds and
// renders the consumers. The token comes from the URL fragment (#token=...)
// or the ?token= query parameter (both are moved to sessionStorage and
// removed from the address bar), else the kumiko_auth cookie the browser
// sends by itself. Every value is rendered with textContent.
(function () {
  'use strict';

  var STORAGE_KEY = 'kumiko_admin_token';
  var POLL_MS = 2000;

  function takeToken() {
    var fromHash = new URLSearchParams(location.hash.replace(/^#/, '')).get('token');
    var fromQuery = new URLSearchParams(location.search).get('token');
    var tok = fromHash || fromQuery;
    if (tok) {
      try { sessionStorage.setItem(STORAGE_KEY, tok); } catch (e) { /* storage disabled */ }
      history.replaceState(null, '', location.pathname);
      return tok;
    }
    try { return sessionStorage.getItem(STORAGE_KEY) || ''; } catch (e) { return ''; }
  }

  var token = takeToken();

  function headers(json) {
    var h = { 'Accept': 'application/json' };
    if (token) { h['Authorization'] = 'Bearer ' + token; }
    if (json) { h['Content-Type'] = 'application/json'; }
    return h;
  }

  function showError(msg) {
    var el = document.getElementById('error');
    el.textContent = msg || '';
    el.style.display = msg ? 'block' : 'none';
  }

  async function call(method, path, body) {
    var res = await fetch(path, {
      method: method,
      headers: headers(body !== undefined),
      body: body === undefined ? undefined : JSON.stringify(body),
      credentials: 'same-origin',
      cache: 'no-store'
    });
    var data = null;
    try { data = await res.json(); } catch (e) { /* not JSON */ }
    if (!res.ok) {
      var msg = data && data.error ? data.error.message : res.status + ' ' + res.statusText;
      throw new Error(msg);
    }
    return data ? data.data : null;
  }

  function cell(tr, text, cls) {
    var td = document.createElement('td');
    td.textContent = text === undefined || text === null ? '' : String(text);
    if (cls) { td.className = cls; }
    tr.appendChild(td);
    return td;
  }

  function age(seconds) {
    if (seconds < 60) { return Math.round(seconds) + 's'; }
    if (seconds < 3600) { return Math.round(seconds / 60) + 'm'; }
    return Math.round(seconds / 3600) + 'h';
  }

  function action(td, c, verb) {
    var b = document.createElement('button');
    b.type = 'button';
    b.textContent = verb;
    b.dataset.verb = verb;
    b.addEventListener('click', async function () {
      var who = c.name + (c.instanceId === '__shared__' ? '' : ' (instance ' + c.instanceId + ')');
      if (!window.confirm(verb + ' consumer ' + who + '?')) { return; }
      try {
        await call('POST', '/api/admin/consumers/' + encodeURIComponent(c.name) + '/' + verb +
          '?instance=' + encodeURIComponent(c.instanceId), {});
        showError('');
      } catch (e) {
        showError(verb + ' ' + who + ': ' + e.message);
      }
      load();
    });
    td.appendChild(b);
  }

  function render(rows) {
    var body = document.getElementById('consumers');
    var frag = document.createDocumentFragment();
    var dead = 0, disabled = 0, lag = 0, capped = false;
    rows.forEach(function (c) {
      var tr = document.createElement('tr');
      tr.className = c.status;
      tr.dataset.name = c.name;
      tr.dataset.instance = c.instanceId;
      if (c.status === 'dead') { dead++; }
      if (c.status === 'disabled') { disabled++; }
      lag += c.lag;
      capped = capped || c.lagCapped;
      cell(tr, c.name);
      cell(tr, c.instanceId);
      cell(tr, c.status, 'status');
      cell(tr, c.lag + (c.lagCapped ? '+' : ''), 'num lag');
      cell(tr, c.cursor).title = 'position ' + c.cursorPosition;
      cell(tr, c.attempts, 'num');
      cell(tr, c.eventsProcessed, 'num');
      cell(tr, age(c.heartbeatAgeSeconds) + ' ago');
      var err = c.lastError || '';
      if (c.failedPosition) { err = '#' + c.failedPosition + ': ' + err; }
      cell(tr, err, 'err');
      var acts = cell(tr, '');
      if (c.status === 'dead') { action(acts, c, 'restart'); }
      if (c.status === 'dead' || c.failedPosition) { action(acts, c, 'skip'); }
      if (c.status === 'disabled') { action(acts, c, 'enable'); } else { action(acts, c, 'disable'); }
      frag.appendChild(tr);
    });
    body.replaceChildren(frag);
    document.getElementById('summary').textContent =
      rows.length + ' consumer row(s), ' + dead + ' dead, ' + disabled + ' disabled, total lag ' + lag + (capped ? '+' : '') +
      ' — updated ' + new Date().toLocaleTimeString();
  }

  var loading = false;
  async function load() {
    if (loading) { return; }
    loading = true;
    try {
      render(await call('GET', '/api/admin/consumers'));
      if (document.getElementById('error').dataset.poll) { showError(''); }
      delete document.getElementById('error').dataset.poll;
    } catch (e) {
      showError('cannot load consumers: ' + e.message);
      document.getElementById('error').dataset.poll = '1';
    } finally {
      loading = false;
    }
  }

  // A new #token= on the open page (its URL pasted again with a fresh
  // token) navigates without a reload: take it from there.
  window.addEventListener('hashchange', function () {
    if (!new URLSearchParams(location.hash.replace(/^#/, '')).get('token')) { return; }
    token = takeToken();
    load();
  });

  load();
  setInterval(load, POLL_MS);
})();

// idem dashboard: polls the API's /v1/stats and /v1/recent every second and
// looks keys up with /v1/records. Plain DOM, no dependencies. Keys and
// errors are user data: they go into the page as text, never as HTML.
"use strict";

const POLL_MS = 1000;
const SHOW_FAILURES = 20; // of the 50 the server remembers
const $ = (id) => document.getElementById(id);
let token = sessionStorage.getItem("idem-token") || "";
let inProgressTotal = null; // from the store's count, for the list's heading

async function api(path) {
  const headers = token ? { Authorization: "Bearer " + token } : {};
  const resp = await fetch(path, { headers, cache: "no-store" });
  if (resp.status === 401) {
    $("token-form").hidden = false;
    throw new Error("a bearer token is required");
  }
  const body = resp.status === 204 ? null : await resp.json().catch(() => null);
  return { status: resp.status, body };
}

function fmt(n, digits) {
  if (n === null || n === undefined || Number.isNaN(n)) return "–";
  return n.toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: digits });
}

function ms(v) {
  if (!v) return "–";
  return v < 10 ? fmt(v, 2) : v < 100 ? fmt(v, 1) : fmt(v, 0);
}

function keyText(o) {
  if (o.key !== undefined) return o.key;
  return "base64:" + o.key_b64;
}

function cell(tr, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}

function tag(td, text, cls) {
  const s = document.createElement("span");
  s.className = "tag " + cls;
  s.textContent = text;
  td.appendChild(s);
}

function setStatus(ok, text) {
  const s = $("status");
  s.className = "status " + (ok ? "ok" : "bad");
  s.textContent = text;
}

function renderStats(st) {
  $("claims-rate").textContent = fmt(st.claims_per_s, st.claims_per_s < 10 ? 1 : 0);
  $("req-rate").textContent = fmt(st.requests_per_s, st.requests_per_s < 10 ? 1 : 0);
  $("dup-rate").textContent = fmt(st.duplicate_rate * 100, 1) + " %";
  let total = 0;
  for (const k in st.totals) total += st.totals[k];
  $("total-claims").textContent = fmt(total, 0);
  $("total-replayed").textContent = fmt(st.totals.completed || 0, 0);
  $("p50").textContent = ms(st.latency.p50_ms);
  $("p90").textContent = ms(st.latency.p90_ms);
  $("p99").textContent = ms(st.latency.p99_ms);
  $("pmax").textContent = ms(st.latency.max_ms);
  for (const k of ["in_progress", "completed", "failed", "released"]) {
    $("rec-" + k).textContent = st.records ? fmt(st.records[k], 0) : "–";
  }
  inProgressTotal = st.records ? st.records.in_progress : null;
  $("rec-note").textContent = st.records ? "live records in the store" : "this store cannot count its records";
  const done = st.series.slice(0, -1); // the last second is still running
  drawBars($("chart-rate"), done);
  drawLine($("chart-lat"), done.map((p) => p.p99_ms));
}

function renderRecent(rc) {
  const ip = $("inprogress-table").tBodies[0];
  ip.replaceChildren();
  const list = rc.in_progress || [];
  let count = "";
  if (rc.in_progress !== null && rc.in_progress_more) {
    count = "(first " + list.length + (inProgressTotal !== null ? " of " + fmt(inProgressTotal, 0) : "") + ")";
  } else if (rc.in_progress !== null) {
    count = "(" + list.length + ")";
  }
  $("inprogress-count").textContent = count;
  $("inprogress-empty").textContent = rc.in_progress === null ? "this store cannot list keys in progress" : "no key in progress";
  $("inprogress-empty").hidden = list.length > 0;
  const now = Date.now();
  for (const r of list) {
    const tr = document.createElement("tr");
    cell(tr, keyText(r), "k");
    cell(tr, r.token);
    cell(tr, r.attempts);
    const td = cell(tr, "");
    const left = (Date.parse(r.lease_until) - now) / 1000;
    if (r.expired || left <= 0) tag(td, "lease lapsed", "expired");
    else td.textContent = fmt(left, 1) + " s left";
    ip.appendChild(tr);
  }
  const fb = $("failures-table").tBodies[0];
  fb.replaceChildren();
  $("failures-empty").hidden = rc.failures.length > 0;
  $("failures-count").textContent = rc.failures.length > SHOW_FAILURES ? "(latest " + SHOW_FAILURES + " of " + rc.failures.length + ")" : "";
  for (const f of rc.failures.slice(0, SHOW_FAILURES)) {
    const tr = document.createElement("tr");
    cell(tr, new Date(f.at).toLocaleTimeString());
    cell(tr, keyText(f), "k");
    tag(cell(tr, ""), f.kind === "failed" ? "failed: dead-lettered" : "released: will retry", f.kind);
    cell(tr, f.error || "");
    fb.appendChild(tr);
  }
}

// canvasCtx sizes the canvas for the screen's pixel ratio.
function canvasCtx(c) {
  const dpr = window.devicePixelRatio || 1;
  const w = c.clientWidth, h = c.clientHeight;
  if (c.width !== Math.round(w * dpr) || c.height !== Math.round(h * dpr)) {
    c.width = Math.round(w * dpr);
    c.height = Math.round(h * dpr);
  }
  const ctx = c.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  return { ctx, w, h };
}

function niceMax(v) {
  if (v <= 0) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

function axes(ctx, w, h, top, left, bottom) {
  ctx.strokeStyle = "#e3e6ec";
  ctx.fillStyle = "#667085";
  ctx.font = "11px system-ui, sans-serif";
  ctx.lineWidth = 1;
  for (const f of [0, 0.5, 1]) {
    const y = Math.round(h - bottom - f * (h - bottom - 8)) + 0.5;
    ctx.beginPath();
    ctx.moveTo(left, y);
    ctx.lineTo(w, y);
    ctx.stroke();
    const v = top * f;
    ctx.fillText(v === 0 ? "0" : fmt(v, v >= 10 ? 0 : v >= 1 ? 1 : 2), 2, y + 4);
  }
  ctx.fillText("-60 s", left, h - 2);
  ctx.fillText("now", w - 24, h - 2);
}

function drawBars(c, series) {
  const { ctx, w, h } = canvasCtx(c);
  const left = 40, bottom = 16;
  const top = niceMax(Math.max(1, ...series.map((p) => p.claims)));
  axes(ctx, w, h, top, left, bottom);
  const bw = (w - left) / series.length;
  const scale = (h - bottom - 8) / top;
  series.forEach((p, i) => {
    const x = left + i * bw + 1;
    const hc = p.claims * scale, hr = p.replayed * scale, he = p.errors * scale;
    ctx.fillStyle = "#2f6fde";
    ctx.fillRect(x, h - bottom - hc, Math.max(1, bw - 2), hc);
    ctx.fillStyle = "#e8890c";
    ctx.fillRect(x, h - bottom - hr, Math.max(1, bw - 2), hr);
    if (he > 0) {
      ctx.fillStyle = "#d0312d";
      ctx.fillRect(x, h - bottom - he, Math.max(1, bw - 2), he);
    }
  });
}

function drawLine(c, values) {
  const { ctx, w, h } = canvasCtx(c);
  const left = 40, bottom = 16;
  const top = niceMax(Math.max(0.1, ...values));
  axes(ctx, w, h, top, left, bottom);
  const step = (w - left) / values.length;
  ctx.strokeStyle = "#2f6fde";
  ctx.lineWidth = 2;
  ctx.beginPath();
  let drawing = false;
  values.forEach((v, i) => {
    const x = left + (i + 0.5) * step;
    const y = h - bottom - (v / top) * (h - bottom - 8);
    if (!v) { drawing = false; return; } // no request in that second
    if (drawing) ctx.lineTo(x, y); else ctx.moveTo(x, y);
    drawing = true;
  });
  ctx.stroke();
}

async function poll() {
  try {
    const [st, rc] = await Promise.all([api("/v1/stats"), api("/v1/recent")]);
    if (st.status !== 200) throw new Error((st.body && st.body.detail) || "stats: HTTP " + st.status);
    renderStats(st.body);
    if (rc.status === 200) renderRecent(rc.body);
    setStatus(true, "live · " + new Date(st.body.now).toLocaleTimeString());
  } catch (e) {
    setStatus(false, e.message);
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

function row(table, name, value, cls) {
  const tr = document.createElement("tr");
  const th = document.createElement("th");
  th.textContent = name;
  tr.appendChild(th);
  const td = cell(tr, "");
  if (cls) tag(td, value, cls); else td.textContent = value;
  table.appendChild(tr);
}

async function lookUp(ev) {
  ev.preventDefault();
  const out = $("record");
  const key = $("search-key").value;
  if (!key) return;
  const param = $("search-b64").checked ? "key_b64=" : "key=";
  out.replaceChildren();
  const p = document.createElement("p");
  try {
    const r = await api("/v1/records?" + param + encodeURIComponent(key));
    if (r.status === 404) {
      p.className = "msg";
      p.textContent = "No live record for " + JSON.stringify(key) + ": never claimed, evicted, or past its retention.";
      out.appendChild(p);
      return;
    }
    if (r.status !== 200) throw new Error((r.body && (r.body.detail || r.body.error)) || "HTTP " + r.status);
    const rec = r.body;
    const t = document.createElement("table");
    t.id = "record-table";
    row(t, "key", keyText(rec));
    row(t, "state", rec.state, rec.state);
    row(t, "token", String(rec.token));
    row(t, "attempts", String(rec.attempts));
    if (rec.result !== undefined || rec.result_b64 !== undefined) row(t, "result", rec.result !== undefined ? rec.result : "base64:" + rec.result_b64);
    if (rec.last_error) row(t, "last error", rec.last_error);
    if (rec.fingerprint !== undefined || rec.fingerprint_b64 !== undefined) row(t, "fingerprint", rec.fingerprint !== undefined ? rec.fingerprint : "base64:" + rec.fingerprint_b64);
    if (rec.lease_until) row(t, "lease until", new Date(rec.lease_until).toISOString());
    row(t, "created", new Date(rec.created_at).toISOString());
    row(t, "updated", new Date(rec.updated_at).toISOString());
    row(t, "expires", new Date(rec.expires_at).toISOString());
    out.appendChild(t);
  } catch (e) {
    p.className = "err";
    p.textContent = e.message;
    out.appendChild(p);
  }
}

$("search-form").addEventListener("submit", lookUp);
$("token-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  token = $("token").value.trim();
  sessionStorage.setItem("idem-token", token);
  $("token-form").hidden = true;
});
poll();
